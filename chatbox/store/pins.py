"""Models pinned warm by an admin: the pre-warmer keeps them loaded whatever their hours."""

from __future__ import annotations

import time
from dataclasses import dataclass

from chatbox.store.db import Database


@dataclass(frozen=True)
class Pin:
    model: str
    actor_name: str
    at: float


class PinRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def pin(self, model: str, actor_name: str) -> bool:
        """Pin `model`; False where it was pinned already."""
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "INSERT INTO prewarm_pins (model, actor_name, at) VALUES (?, ?, ?)"
                " ON CONFLICT (model) DO NOTHING RETURNING model",
                (model, actor_name, time.time()),
            )
            return await cur.fetchone() is not None

    async def unpin(self, model: str) -> bool:
        """Unpin `model`; False where it was not pinned."""
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "DELETE FROM prewarm_pins WHERE model = ? RETURNING model", (model,)
            )
            return await cur.fetchone() is not None

    async def all(self) -> list[Pin]:
        rows = await self.db.fetchall("SELECT * FROM prewarm_pins ORDER BY model")
        return [Pin(r["model"], r["actor_name"], float(r["at"])) for r in rows]
