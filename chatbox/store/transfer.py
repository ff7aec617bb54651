"""Moving a user's data out (export reads) and in (an import, one transaction), and the
zero-data-retention switches of accounts and API keys."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from chatbox.store.db import Database
from chatbox.store.keys import hash_token
from chatbox.store.records import Conversation, Turn, new_id


@dataclass(frozen=True)
class TurnIn:
    """One imported message; `parent` is an index into the same conversation's list
    (always an earlier one), or None for a first message."""

    role: str  # user | assistant
    content: str
    parent: int | None
    created_at: float
    model: str | None = None


@dataclass(frozen=True)
class ConversationIn:
    title: str | None
    system_prompt: str | None
    created_at: float
    updated_at: float
    turns: Sequence[TurnIn]
    current: int | None  # index of the active leaf


class TransferRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- export ---------------------------------------------------------------------------

    async def conversations(self, user_id: str) -> list[Conversation]:
        """Every live conversation of the user, oldest first (no page limit)."""
        rows = await self.db.fetchall(
            "SELECT * FROM conversations WHERE user_id = ? AND deleted_at IS NULL"
            " ORDER BY created_at, id",
            (user_id,),
        )
        return [Conversation.from_row(r) for r in rows]

    async def turns(self, conv_id: str) -> list[Turn]:
        """All of a conversation's turns, every branch, in the order they were written."""
        rows = await self.db.fetchall(
            "SELECT * FROM turns WHERE conversation_id = ? ORDER BY seq", (conv_id,)
        )
        return [Turn.from_row(r) for r in rows]

    async def chunk_texts(self, user_id: str, doc_id: str) -> list[tuple[int | None, int, str]]:
        """A document's chunks as (page, offset in the page's text, text), in order."""
        rows = await self.db.fetchall(
            "SELECT page, start_char, text FROM chunks WHERE document_id = ? AND user_id = ?"
            " ORDER BY ord",
            (doc_id, user_id),
        )
        return [(r["page"], int(r["start_char"]), r["text"]) for r in rows]

    # -- import ---------------------------------------------------------------------------

    async def import_conversations(
        self, user_id: str, convs: Sequence[ConversationIn]
    ) -> list[str]:
        """Create these conversations with all their turns, all or nothing; their ids."""
        ids: list[str] = []
        async with self.db.transaction() as tx:
            for conv in convs:
                conv_id = new_id("c")
                turn_ids = [new_id("t") for _ in conv.turns]
                await tx.execute(
                    "INSERT INTO conversations (id, user_id, title, system_prompt, created_at,"
                    " updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        conv_id,
                        user_id,
                        conv.title,
                        conv.system_prompt,
                        conv.created_at,
                        conv.updated_at,
                    ),
                )
                await tx.executemany(
                    "INSERT INTO turns (id, conversation_id, parent_id, role, content, status,"
                    " model, created_at) VALUES (?, ?, ?, ?, ?, 'complete', ?, ?)",
                    [
                        (
                            turn_ids[i],
                            conv_id,
                            None if t.parent is None else turn_ids[t.parent],
                            t.role,
                            t.content,
                            t.model,
                            t.created_at,
                        )
                        for i, t in enumerate(conv.turns)
                    ],
                )
                leaf = None if conv.current is None else turn_ids[conv.current]
                await tx.execute(
                    "UPDATE conversations SET active_leaf_id = ? WHERE id = ?", (leaf, conv_id)
                )
                ids.append(conv_id)
        return ids

    # -- zero-data-retention switches -----------------------------------------------------

    async def user_zero_retention(self, user_id: str) -> bool:
        row = await self.db.fetchone("SELECT zero_retention FROM users WHERE id = ?", (user_id,))
        return bool(row and row[0])

    async def set_user_zero_retention(self, user_id: str, on: bool) -> None:
        async with self.db.transaction() as tx:
            await tx.execute("UPDATE users SET zero_retention = ? WHERE id = ?", (int(on), user_id))

    async def key_zero_retention(self, secret: str) -> bool:
        row = await self.db.fetchone(
            "SELECT zero_retention FROM api_keys WHERE key_hash = ? AND revoked_at IS NULL",
            (hash_token(secret),),
        )
        return bool(row and row[0])

    async def set_key_zero_retention(self, key_id: str, on: bool) -> bool:
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "UPDATE api_keys SET zero_retention = ? WHERE id = ? AND revoked_at IS NULL",
                (int(on), key_id),
            )
        return cur.rowcount > 0

    async def content_rows(self) -> dict[str, int]:
        """Rows of every table that holds content (for tools and tests of retention)."""
        out = {}
        for table in ("conversations", "turns", "drafts", "memories", "documents", "chunks"):
            row = await self.db.fetchone(f"SELECT count(*) FROM {table}")
            out[table] = int(row[0])
        return out
