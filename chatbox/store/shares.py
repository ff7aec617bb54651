"""Share links: read-only snapshots of a conversation, found by the hash of their token.

The text of the shared turns (and of the passages their answers cite) is copied in at share
time, so a later edit or erasure of the conversation leaves a snapshot as it was shared.
Revoking deletes the snapshot outright: its text does not outlive the link.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from chatbox.store.db import Database
from chatbox.store.erasure import ErasureRepo
from chatbox.store.keys import hash_token
from chatbox.store.records import new_id


@dataclass(frozen=True)
class Share:
    id: str
    user_id: str
    conversation_id: str
    title: str | None
    upto_turn_id: str
    turns: int
    created_at: float

    @classmethod
    def from_row(cls, row: Any) -> Share:
        return cls(
            row["id"],
            row["user_id"],
            row["conversation_id"],
            row["title"],
            row["upto_turn_id"],
            row["turns"],
            row["created_at"],
        )


@dataclass(frozen=True)
class SharedPassage:
    document: str
    page: int | None
    text: str


@dataclass(frozen=True)
class SharedTurn:
    role: str
    content: str
    model: str | None
    passages: tuple[SharedPassage, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    share: Share
    turns: list[SharedTurn]


class ShareRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def create(
        self,
        user_id: str,
        conversation_id: str,
        title: str | None,
        turns: Sequence[SharedTurn],
        upto_turn_id: str,
    ) -> tuple[Share, str]:
        """Store a snapshot; returns it and its token (shown once, only its hash is kept)."""
        token = secrets.token_urlsafe(24)
        share_id = new_id("s")
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO shares (id, token_hash, user_id, conversation_id, title,"
                " upto_turn_id, turns, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    share_id,
                    hash_token(token),
                    user_id,
                    conversation_id,
                    title,
                    upto_turn_id,
                    len(turns),
                    time.time(),
                ),
            )
            for i, turn in enumerate(turns):
                await tx.execute(
                    "INSERT INTO share_turns (share_id, ord, role, content, model)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (share_id, i, turn.role, turn.content, turn.model),
                )
                for j, p in enumerate(turn.passages):
                    await tx.execute(
                        "INSERT INTO share_passages (share_id, turn_ord, ord, document, page,"
                        " text) VALUES (?, ?, ?, ?, ?, ?)",
                        (share_id, i, j, p.document, p.page, p.text),
                    )
        share = await self.get(user_id, share_id)
        assert share is not None
        return share, token

    async def get(self, user_id: str, share_id: str) -> Share | None:
        row = await self.db.fetchone(
            "SELECT * FROM shares WHERE id = ? AND user_id = ?", (share_id, user_id)
        )
        return Share.from_row(row) if row else None

    async def list(self, user_id: str, conversation_id: str | None = None) -> list[Share]:
        """The user's links (of one conversation, when given), newest first."""
        sql = "SELECT * FROM shares WHERE user_id = ?"
        params: tuple[str, ...] = (user_id,)
        if conversation_id is not None:
            sql += " AND conversation_id = ?"
            params += (conversation_id,)
        rows = await self.db.fetchall(sql + " ORDER BY created_at DESC, id DESC", params)
        return [Share.from_row(r) for r in rows]

    async def snapshot(self, token: str) -> Snapshot | None:
        """The snapshot behind a token, or None (unknown or revoked)."""
        row = await self.db.fetchone(
            "SELECT * FROM shares WHERE token_hash = ?", (hash_token(token),)
        )
        if row is None:
            return None
        share = Share.from_row(row)
        turns = await self.db.fetchall(
            "SELECT * FROM share_turns WHERE share_id = ? ORDER BY ord", (share.id,)
        )
        passages = await self.db.fetchall(
            "SELECT * FROM share_passages WHERE share_id = ? ORDER BY turn_ord, ord", (share.id,)
        )
        cited: dict[int, list[SharedPassage]] = {}
        for p in passages:
            cited.setdefault(p["turn_ord"], []).append(
                SharedPassage(p["document"], p["page"], p["text"])
            )
        return Snapshot(
            share,
            [
                SharedTurn(t["role"], t["content"], t["model"], tuple(cited.get(t["ord"], ())))
                for t in turns
            ],
        )

    async def revoke(self, user_id: str, share_ids: Sequence[str]) -> int:
        """Erase these links of the user, their text with them; how many went."""
        rows = await self.db.fetchall_in(
            "SELECT id FROM shares WHERE id IN ({marks}) AND user_id = ?", share_ids, (user_id,)
        )
        await ErasureRepo(self.db).shares([r["id"] for r in rows])
        return len(rows)

    async def revoke_conversation(self, user_id: str, conversation_id: str) -> int:
        """Revoke every link of one conversation."""
        shares = await self.list(user_id, conversation_id)
        return await self.revoke(user_id, [s.id for s in shares])
