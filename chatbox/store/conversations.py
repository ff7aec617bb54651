"""Conversations: started by one user, seen as `visible_to` says; deletion is a tombstone."""

from __future__ import annotations

import builtins
import time

from chatbox.store.db import Database
from chatbox.store.records import Conversation, new_id
from chatbox.store.visibility import visible_to

_UNSET = object()


class ConversationRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def create(
        self,
        user_id: str,
        title: str | None = None,
        system_prompt: str | None = None,
        model: str | None = None,
    ) -> Conversation:
        conv_id = new_id("c")
        now = time.time()
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO conversations (id, user_id, title, system_prompt, model, created_at,"
                " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (conv_id, user_id, title, system_prompt, model, now, now),
            )
        conv = await self.get(user_id, conv_id)
        assert conv is not None
        return conv

    async def get(self, user_id: str, conv_id: str) -> Conversation | None:
        """The conversation if it exists, is not deleted, and user_id may see it (their own,
        or in a workspace they belong to)."""
        visible, params = visible_to(user_id)
        row = await self.db.conversation_reads.fetchone(
            f"SELECT * FROM conversations WHERE id = ? AND {visible} AND deleted_at IS NULL",
            (conv_id, *params),
        )
        return Conversation.from_row(row) if row else None

    async def list(self, user_id: str, limit: int = 200) -> list[Conversation]:
        visible, params = visible_to(user_id)
        rows = await self.db.conversation_reads.fetchall(
            f"SELECT * FROM conversations WHERE {visible} AND deleted_at IS NULL"
            " ORDER BY updated_at DESC, id DESC LIMIT ?",
            (*params, limit),
        )
        return [Conversation.from_row(r) for r in rows]

    async def started(self, user_id: str) -> builtins.list[Conversation]:
        """Every live conversation the user started and may still see, oldest first, with
        no page limit (an export: one left behind in a workspace they left is not theirs)."""
        visible, params = visible_to(user_id)
        rows = await self.db.conversation_reads.fetchall(
            f"SELECT * FROM conversations WHERE user_id = ? AND {visible}"
            " AND deleted_at IS NULL ORDER BY created_at, id",
            (user_id, *params),
        )
        return [Conversation.from_row(r) for r in rows]

    async def update(
        self,
        user_id: str,
        conv_id: str,
        *,
        title: object = _UNSET,
        system_prompt: object = _UNSET,
        model: object = _UNSET,
    ) -> Conversation | None:
        """Change title / system prompt / model; None when not found for this user."""
        changes = {
            k: v
            for k, v in (("title", title), ("system_prompt", system_prompt), ("model", model))
            if v is not _UNSET
        }
        if changes:
            sets = ", ".join(f"{k} = ?" for k in changes)
            visible, params = visible_to(user_id)
            async with self.db.transaction() as tx:
                await tx.execute(
                    f"UPDATE conversations SET {sets}, updated_at = ?"
                    f" WHERE id = ? AND {visible} AND deleted_at IS NULL",
                    (*changes.values(), time.time(), conv_id, *params),
                )
        return await self.get(user_id, conv_id)

    async def delete(self, user_id: str, conv_id: str) -> bool:
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "UPDATE conversations SET deleted_at = ?"
                " WHERE id = ? AND user_id = ? AND deleted_at IS NULL",
                (time.time(), conv_id, user_id),
            )
        return bool(cur.rowcount > 0)
