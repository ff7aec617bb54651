"""Users: the owners of every conversation, memory and file; passwords hashed with argon2."""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from chatbox.store.db import Database
from chatbox.store.records import User, new_id

LOCAL_USER = "local"
ROLES = ("admin", "member")
_HASHER = PasswordHasher()  # argon2id, memory-hard (64 MiB, 3 passes)


@functools.cache
def _dummy_hash() -> str:
    """A hash to verify against for unknown names (equal work); made on first use."""
    return _HASHER.hash("not a real password")


def hash_password(password: str) -> str:
    return _HASHER.hash(password)


def _verify(stored: str | None, password: str) -> bool:
    try:
        return _HASHER.verify(stored or _dummy_hash(), password) and stored is not None
    except (VerificationError, InvalidHashError):
        return False


class UserRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def get(self, user_id: str) -> User | None:
        row = await self.db.fetchone("SELECT * FROM users WHERE id = ?", (user_id,))
        return User.from_row(row) if row else None

    async def get_by_name(self, name: str) -> User | None:
        row = await self.db.fetchone("SELECT * FROM users WHERE name = ?", (name,))
        return User.from_row(row) if row else None

    async def list(self) -> list[User]:
        # An erased account's row stays only so that its usage stays counted; it is not listed.
        rows = await self.db.fetchall(
            "SELECT * FROM users WHERE deleted_at IS NULL ORDER BY created_at, name"
        )
        return [User.from_row(r) for r in rows]

    async def count(self) -> int:
        row = await self.db.fetchone("SELECT COUNT(*) FROM users WHERE name != ?", (LOCAL_USER,))
        return int(row[0])

    async def create(
        self, name: str, role: str = "member", tier: str = "free", password: str | None = None
    ) -> User:
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}")
        user_id = new_id("u")
        pw_hash = await asyncio.to_thread(hash_password, password) if password else None
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO users (id, name, role, tier, password_hash, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (user_id, name, role, tier, pw_hash, time.time()),
            )
        user = await self.get(user_id)
        assert user is not None
        return user

    async def _set(self, user_id: str, column: str, value: Any) -> User | None:
        assert column in {"name", "role", "tier", "disabled", "password_hash"}
        async with self.db.transaction() as tx:
            await tx.execute(f"UPDATE users SET {column} = ? WHERE id = ?", (value, user_id))
        return await self.get(user_id)

    async def rename(self, user_id: str, name: str) -> User | None:
        return await self._set(user_id, "name", name)

    async def set_tier(self, user_id: str, tier: str) -> User | None:
        return await self._set(user_id, "tier", tier)

    async def set_role(self, user_id: str, role: str) -> User | None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}")
        return await self._set(user_id, "role", role)

    async def set_disabled(self, user_id: str, disabled: bool = True) -> User | None:
        """A disabled user's sessions end and keys stop working at once."""
        user = await self._set(user_id, "disabled", int(disabled))
        if disabled:
            async with self.db.transaction() as tx:
                await tx.execute("DELETE FROM sessions WHERE user_id = ?", (user_id,))
        return user

    async def set_password(self, user_id: str, password: str) -> User | None:
        """A new password; every existing browser session of the user ends."""
        pw_hash = await asyncio.to_thread(hash_password, password)
        user = await self._set(user_id, "password_hash", pw_hash)
        async with self.db.transaction() as tx:
            await tx.execute("DELETE FROM sessions WHERE user_id = ?", (user_id,))
        return user

    async def mark_password_reset(self, user_id: str, at: float) -> None:
        """Remember that someone else set this password, to tell its owner at their next login."""
        async with self.db.transaction() as tx:
            await tx.execute("UPDATE users SET password_reset_at = ? WHERE id = ?", (at, user_id))

    async def take_password_reset(self, user_id: str) -> float | None:
        """When someone else last set the password, if its owner has not been told; told now."""
        row = await self.db.fetchone("SELECT password_reset_at FROM users WHERE id = ?", (user_id,))
        if row is None or row["password_reset_at"] is None:
            return None
        async with self.db.transaction() as tx:
            await tx.execute("UPDATE users SET password_reset_at = NULL WHERE id = ?", (user_id,))
        return float(row["password_reset_at"])

    async def check_password(self, name: str, password: str) -> User | None:
        """The user when the name and password match and the account is enabled."""
        user = await self.verify_password(name, password)
        return None if user is None or user.disabled else user

    async def verify_password(self, name: str, password: str) -> User | None:
        """The user when the name and password match, disabled or not (the caller decides)."""
        row = await self.db.fetchone("SELECT * FROM users WHERE name = ?", (name,))
        stored = row["password_hash"] if row else None
        ok = await asyncio.to_thread(_verify, stored, password)
        if not ok or row is None:
            return None
        return User.from_row(row)

    async def ensure_local_user(self) -> User:
        """The single local user that owns everything until accounts are enabled."""
        user = await self.get_by_name(LOCAL_USER)
        return user if user is not None else await self.create(LOCAL_USER, role="admin")
