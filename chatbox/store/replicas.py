"""The replica table of router mode: which remote engines an operator added (not their health)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from chatbox.store.db import Database


@dataclass(frozen=True)
class ReplicaRow:
    url: str
    kind: str  # chatbox | openai
    slots: int  # answers at once (0: ask the replica; an OpenAI server's must be configured)
    models: tuple[str, ...]  # for an OpenAI server: the models it serves (empty: ask it)
    secret: str | None
    draining: bool
    added_at: float

    @classmethod
    def from_row(cls, row: Any) -> ReplicaRow:
        models = tuple(m for m in str(row["models"]).split(",") if m)
        return cls(
            row["url"],
            row["kind"],
            int(row["slots"]),
            models,
            row["secret"],
            bool(row["draining"]),
            float(row["added_at"]),
        )


class ReplicaRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def list(self) -> list[ReplicaRow]:
        rows = await self.db.fetchall("SELECT * FROM replicas ORDER BY added_at, url")
        return [ReplicaRow.from_row(r) for r in rows]

    async def upsert(
        self,
        url: str,
        kind: str,
        slots: int = 0,
        models: tuple[str, ...] = (),
        secret: str | None = None,
    ) -> ReplicaRow:
        """Add a replica, or change how one is reached (it stays where it was in the list)."""
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO replicas (url, kind, slots, models, secret, added_at)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(url) DO UPDATE SET kind = excluded.kind,"
                " slots = excluded.slots, models = excluded.models, secret = excluded.secret,"
                " draining = 0",
                (url, kind, slots, ",".join(models), secret, time.time()),
            )
        row = await self.db.fetchone("SELECT * FROM replicas WHERE url = ?", (url,))
        return ReplicaRow.from_row(row)

    async def remove(self, url: str) -> bool:
        async with self.db.transaction() as tx:
            cur = await tx.execute("DELETE FROM replicas WHERE url = ?", (url,))
            return bool(cur.rowcount)

    async def set_draining(self, url: str, draining: bool) -> bool:
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "UPDATE replicas SET draining = ? WHERE url = ?", (int(draining), url)
            )
            return bool(cur.rowcount)
