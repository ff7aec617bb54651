"""API keys: shown once, stored as SHA-256 hashes (they are 256-bit random, not passwords)."""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Any

from chatbox.store.db import Database
from chatbox.store.records import User, new_id

KEY_PREFIX = "cbx-"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class ApiKey:
    id: str
    user_id: str
    name: str | None
    prefix: str  # the first characters, to tell keys apart in listings
    created_at: float
    last_used_at: float | None
    revoked_at: float | None

    @classmethod
    def from_row(cls, row: Any) -> ApiKey:
        return cls(
            row["id"],
            row["user_id"],
            row["name"],
            row["prefix"],
            row["created_at"],
            row["last_used_at"],
            row["revoked_at"],
        )


class KeyRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def create(self, user_id: str, name: str | None = None) -> tuple[ApiKey, str]:
        """A new key for the user: the record and the secret (never stored, shown once)."""
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        key_id = new_id("k")
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO api_keys (id, user_id, name, prefix, key_hash, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (key_id, user_id, name, secret[:10], hash_token(secret), time.time()),
            )
        row = await self.db.fetchone("SELECT * FROM api_keys WHERE id = ?", (key_id,))
        return ApiKey.from_row(row), secret

    async def list(self, user_id: str | None = None) -> list[ApiKey]:
        if user_id is None:
            rows = await self.db.fetchall("SELECT * FROM api_keys ORDER BY created_at")
        else:
            rows = await self.db.fetchall(
                "SELECT * FROM api_keys WHERE user_id = ? ORDER BY created_at", (user_id,)
            )
        return [ApiKey.from_row(r) for r in rows]

    async def get(self, key_id: str) -> ApiKey | None:
        row = await self.db.fetchone("SELECT * FROM api_keys WHERE id = ?", (key_id,))
        return ApiKey.from_row(row) if row else None

    async def revoke(self, key_id: str) -> bool:
        """Revoke a key (by id or its prefix); it stops working at once."""
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "UPDATE api_keys SET revoked_at = ? WHERE (id = ? OR prefix = ?)"
                " AND revoked_at IS NULL",
                (time.time(), key_id, key_id),
            )
            return bool(cur.rowcount)

    async def authenticate(self, secret: str) -> User | None:
        """The enabled user owning this unrevoked key, or None (read from the last commit:
        a revocation is committed before it is reported)."""
        row = await self.db.snapshot.fetchone(
            "SELECT u.* FROM api_keys k JOIN users u ON u.id = k.user_id"
            " WHERE k.key_hash = ? AND k.revoked_at IS NULL AND u.disabled = 0",
            (hash_token(secret),),
        )
        return User.from_row(row) if row else None
