"""Stored answers of the Responses API (`/v1/responses`): one row per response, its input
(the conversation it answered, as JSON) and the response object itself, by user.

Both are content (declared in `chatbox.store.content`): erased with the account, deleted by
their owner, and past the tier's retention by the sweeper. Nothing is written under
zero-data-retention or for a request with `store: false`: the chat layer asks before `add`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from chatbox.store.db import Database


@dataclass(frozen=True)
class StoredResponse:
    id: str
    user_id: str
    model: str
    input: str  # JSON: the messages the response answered (its chain's, instructions aside)
    output: str  # JSON: the response object as it was sent
    created_at: float

    @classmethod
    def from_row(cls, row: Any) -> StoredResponse:
        return cls(
            row["id"],
            row["user_id"],
            row["model"],
            row["input"],
            row["output"],
            float(row["created_at"]),
        )


class ResponseRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def add(
        self, response_id: str, user_id: str, model: str, input: str, output: str
    ) -> None:
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO responses (id, user_id, model, input, output, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (response_id, user_id, model, input, output, time.time()),
            )

    async def get(self, response_id: str, user_id: str) -> StoredResponse | None:
        """The response, if it is this user's."""
        row = await self.db.fetchone(
            "SELECT * FROM responses WHERE id = ? AND user_id = ?", (response_id, user_id)
        )
        return StoredResponse.from_row(row) if row else None

    async def delete(self, response_id: str, user_id: str) -> bool:
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "DELETE FROM responses WHERE id = ? AND user_id = ?", (response_id, user_id)
            )
            return bool(cur.rowcount)

    async def of_user(self, user_id: str) -> list[StoredResponse]:
        """The user's responses, oldest first (the export)."""
        rows = await self.db.fetchall(
            "SELECT * FROM responses WHERE user_id = ? ORDER BY created_at", (user_id,)
        )
        return [StoredResponse.from_row(r) for r in rows]

    async def expire(self, tier: str, before: float) -> int:
        """Delete the responses of the tier's users made before `before`; how many."""
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "DELETE FROM responses WHERE created_at < ?"
                " AND user_id IN (SELECT id FROM users WHERE tier = ?)",
                (before, tier),
            )
            return int(cur.rowcount or 0)
