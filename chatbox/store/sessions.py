"""Browser sessions: the cookie holds a random token; only its hash is stored."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from chatbox.store.db import Database
from chatbox.store.keys import hash_token
from chatbox.store.records import User


@dataclass(frozen=True)
class Session:
    user: User
    csrf_token: str
    expires_at: float


class SessionRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def create(self, user_id: str, ttl_s: float) -> tuple[str, str]:
        """A new session: (cookie token, CSRF token)."""
        token, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(24)
        now = time.time()
        async with self.db.transaction() as tx:
            await tx.execute("DELETE FROM sessions WHERE expires_at < ?", (now,))
            await tx.execute(
                "INSERT INTO sessions (token_hash, user_id, csrf_token, created_at, expires_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (hash_token(token), user_id, csrf, now, now + ttl_s),
            )
        return token, csrf

    async def get(self, token: str) -> Session | None:
        """The live session of an enabled user for this cookie token."""
        row = await self.db.fetchone(
            "SELECT u.*, s.csrf_token AS csrf, s.expires_at AS expires FROM sessions s"
            " JOIN users u ON u.id = s.user_id"
            " WHERE s.token_hash = ? AND s.expires_at > ? AND u.disabled = 0",
            (hash_token(token), time.time()),
        )
        return Session(User.from_row(row), row["csrf"], row["expires"]) if row else None

    async def delete(self, token: str) -> None:
        async with self.db.transaction() as tx:
            await tx.execute("DELETE FROM sessions WHERE token_hash = ?", (hash_token(token),))

    async def end_all(self, user_id: str) -> None:
        """End every browser session of `user_id`."""
        async with self.db.transaction() as tx:
            await tx.execute("DELETE FROM sessions WHERE user_id = ?", (user_id,))
