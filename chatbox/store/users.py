"""Users: the owners of every conversation, memory and file."""

from __future__ import annotations

import time

from chatbox.store.db import Database
from chatbox.store.records import User, new_id

LOCAL_USER = "local"


class UserRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def get(self, user_id: str) -> User | None:
        row = await self.db.fetchone("SELECT * FROM users WHERE id = ?", (user_id,))
        return User.from_row(row) if row else None

    async def get_by_name(self, name: str) -> User | None:
        row = await self.db.fetchone("SELECT * FROM users WHERE name = ?", (name,))
        return User.from_row(row) if row else None

    async def create(self, name: str, role: str = "member", tier: str = "free") -> User:
        user_id = new_id("u")
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO users (id, name, role, tier, created_at) VALUES (?, ?, ?, ?, ?)",
                (user_id, name, role, tier, time.time()),
            )
        user = await self.get(user_id)
        assert user is not None
        return user

    async def ensure_local_user(self) -> User:
        """The single local user that owns everything until accounts are enabled."""
        user = await self.get_by_name(LOCAL_USER)
        return user if user is not None else await self.create(LOCAL_USER, role="admin")
