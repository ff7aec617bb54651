"""Moderation items: what a check warned about, flagged or blocked, and its review.

An item names the user, tier, direction, category and scores; its text is kept only where
the policy keeps text (never under zero-data-retention, never for a blocked message).
"""

from __future__ import annotations

import builtins
import json
import time
from dataclasses import dataclass, field
from typing import Any

from chatbox.store.db import Database
from chatbox.store.records import new_id

REVIEW_STATES = ("open", "noted", "dismissed", "confirmed")  # noted: a warning, not queued


@dataclass(frozen=True)
class ModerationItem:
    id: str
    created_at: float
    user_id: str | None
    user_name: str | None
    tier: str
    direction: str
    action: str
    category: str
    scores: dict[str, float] = field(default_factory=dict)
    text: str | None = None
    conversation_id: str | None = None
    turn_id: str | None = None
    source: str | None = None  # a document's name, a rule's name, an API call
    status: str = "open"
    resolved_by: str | None = None
    resolved_at: float | None = None

    @classmethod
    def from_row(cls, row: Any) -> ModerationItem:
        return cls(
            row["id"],
            row["created_at"],
            row["user_id"],
            row["user_name"],
            row["tier"],
            row["direction"],
            row["action"],
            row["category"],
            json.loads(row["scores"] or "{}"),
            row["text"],
            row["conversation_id"],
            row["turn_id"],
            row["source"],
            row["status"],
            row["resolved_by"],
            row["resolved_at"],
        )


class ModerationRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def add(
        self,
        *,
        user_id: str | None,
        tier: str,
        direction: str,
        action: str,
        category: str,
        scores: dict[str, float],
        text: str | None = None,
        conversation_id: str | None = None,
        turn_id: str | None = None,
        source: str | None = None,
    ) -> ModerationItem:
        item_id = new_id("m")
        status = "noted" if action == "warn" else "open"
        rounded = {k: round(v, 4) for k, v in scores.items()}
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO moderation_items (id, created_at, user_id, tier, direction, action,"
                " category, scores, text, conversation_id, turn_id, source, status)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    item_id,
                    time.time(),
                    user_id,
                    tier,
                    direction,
                    action,
                    category,
                    json.dumps(rounded, sort_keys=True),
                    text,
                    conversation_id,
                    turn_id,
                    source,
                    status,
                ),
            )
        item = await self.get(item_id)
        assert item is not None
        return item

    async def get(self, item_id: str) -> ModerationItem | None:
        row = await self.db.fetchone(
            "SELECT m.*, u.name AS user_name FROM moderation_items m"
            " LEFT JOIN users u ON u.id = m.user_id WHERE m.id = ?",
            (item_id,),
        )
        return ModerationItem.from_row(row) if row else None

    async def list(
        self, status: str | None = "open", limit: int = 100
    ) -> builtins.list[ModerationItem]:
        """Newest first; status None lists every state."""
        where: builtins.list[str] = []
        params: builtins.list[str] = []
        if status is not None:
            where.append("m.status = ?")
            params.append(status)
        sql = (
            "SELECT m.*, u.name AS user_name FROM moderation_items m"
            " LEFT JOIN users u ON u.id = m.user_id"
        )
        if where:
            sql += " WHERE " + " AND ".join(where)
        # PostgreSQL has no rowid; ids begin with their creation time in milliseconds.
        last = "m.rowid" if self.db.dialect == "sqlite" else "m.id"
        sql += f" ORDER BY m.created_at DESC, {last} DESC LIMIT ?"
        rows = await self.db.fetchall(sql, (*params, max(1, min(limit, 10_000))))
        return [ModerationItem.from_row(r) for r in rows]

    async def for_turns(
        self, conversation_id: str, turn_ids: builtins.list[str]
    ) -> builtins.list[ModerationItem]:
        """The items about these turns of a conversation (their marks in the chat view)."""
        rows = await self.db.fetchall_in(
            "SELECT m.*, NULL AS user_name FROM moderation_items m"
            " WHERE m.turn_id IN ({marks}) AND m.conversation_id = ? ORDER BY m.created_at",
            turn_ids,
            (conversation_id,),
        )
        return [ModerationItem.from_row(r) for r in rows]

    async def resolve(self, item_id: str, status: str, by: str) -> ModerationItem | None:
        if status not in ("dismissed", "confirmed"):
            raise ValueError(f"unknown resolution {status!r}")
        async with self.db.transaction() as tx:
            await tx.execute(
                "UPDATE moderation_items SET status = ?, resolved_by = ?, resolved_at = ?"
                " WHERE id = ?",
                (status, by, time.time(), item_id),
            )
        return await self.get(item_id)
