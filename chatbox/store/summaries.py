"""Summaries of a conversation's oldest turns: append-only rows, each covering its branch's
turns from the root down to `covers_id`.

A summary is not a node of the turn tree (it would become a sibling branch there); it is
tied to the turn it covers up to, so it applies to every branch path that holds that turn
and to no other. Rows are never rewritten; they go only with an erased conversation (the
turn they cover takes them along, ON DELETE CASCADE).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from chatbox.store.db import Database
from chatbox.store.records import new_id


@dataclass(frozen=True)
class Summary:
    id: str
    seq: int
    conversation_id: str
    covers_id: str  # the last turn it covers (its branch from the root down to this turn)
    covered: int  # how many turns it covers
    content: str
    model: str | None
    created_at: float

    @classmethod
    def from_row(cls, row: Any) -> Summary:
        return cls(
            row["id"],
            row["seq"],
            row["conversation_id"],
            row["covers_id"],
            row["covered"],
            row["content"],
            row["model"],
            row["created_at"],
        )


class SummaryRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def add(
        self, conv_id: str, covers_id: str, covered: int, content: str, model: str | None
    ) -> Summary:
        summary_id = new_id("s")
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO summaries (id, conversation_id, covers_id, covered, content, model,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (summary_id, conv_id, covers_id, covered, content, model, time.time()),
            )
        row = await self.db.fetchone("SELECT * FROM summaries WHERE id = ?", (summary_id,))
        assert row is not None
        return Summary.from_row(row)

    async def on_path(self, conv_id: str, path_ids: Sequence[str]) -> Summary | None:
        """The summary reaching furthest down this branch path (root first), or None."""
        if not path_ids:
            return None
        depth = {turn_id: i for i, turn_id in enumerate(path_ids)}
        rows = await self.db.fetchall(
            "SELECT * FROM summaries WHERE conversation_id = ? ORDER BY seq", (conv_id,)
        )
        best: Summary | None = None
        for row in rows:
            if row["covers_id"] in depth and (
                best is None or depth[row["covers_id"]] >= depth[best.covers_id]
            ):
                best = Summary.from_row(row)  # a later one covering as far wins: newer
        return best
