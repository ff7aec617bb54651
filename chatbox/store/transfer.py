"""Moving a user's data out (export reads) and in (an import, in short transactions), and
the zero-data-retention switches of accounts and API keys."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from chatbox.store.db import IN_BATCH, Database
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


IMPORT_ROWS = 250  # rows per import transaction
IMPORT_CHARS = 100_000  # characters per import transaction (indexing them is the cost)


class ImportLost(Exception):
    """Part of an import was erased while it was being written; the rest stays hidden."""


@dataclass
class _Batch:
    conversations: list[tuple[Any, ...]] = field(default_factory=list)
    turns: list[tuple[Any, ...]] = field(default_factory=list)
    leaves: list[tuple[str | None, str]] = field(default_factory=list)


def _batches(
    user_id: str,
    convs: Sequence[ConversationIn],
    ids: Sequence[str],
    staged_at: float,
    imported_at: float | None,
) -> Iterator[_Batch]:
    """The import's rows in transaction-sized batches (a long conversation spans several)."""
    batch, rows, chars = _Batch(), 0, 0
    for conv_id, conv in zip(ids, convs, strict=True):
        turn_ids = [new_id("t") for _ in conv.turns]
        batch.conversations.append(
            (
                conv_id,
                user_id,
                conv.title,
                conv.system_prompt,
                conv.created_at,
                conv.updated_at,
                staged_at,
                imported_at,
            )
        )
        rows += 1
        chars += len(conv.system_prompt or "")
        for i, t in enumerate(conv.turns):
            if rows >= IMPORT_ROWS or chars >= IMPORT_CHARS:
                yield batch
                batch, rows, chars = _Batch(), 0, 0
            parent = None if t.parent is None else turn_ids[t.parent]
            batch.turns.append(
                (turn_ids[i], conv_id, parent, t.role, t.content, t.model, t.created_at)
            )
            rows += 1
            chars += len(t.content)
        batch.leaves.append((None if conv.current is None else turn_ids[conv.current], conv_id))
        if rows >= IMPORT_ROWS or chars >= IMPORT_CHARS:
            yield batch
            batch, rows, chars = _Batch(), 0, 0
    if batch.conversations or batch.turns:
        yield batch


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
        self,
        user_id: str,
        convs: Sequence[ConversationIn],
        imported_at: float | None = None,
        ids: Sequence[str] | None = None,
    ) -> list[str]:
        """Create these conversations with all their turns; their ids (`ids`, or new ones).

        They are written in short transactions (IMPORT_ROWS rows or IMPORT_CHARS characters
        each, so another writer waits for one of them, never the whole import) and stay
        hidden until the last one commits; then all of them appear at once. A failure leaves
        what was written hidden: the caller erases it (the sweeper does, after a crash).
        `imported_at`: when retention starts counting them (None: from their own times)."""
        ids = list(ids) if ids is not None else [new_id("c") for _ in convs]
        staged_at = time.time()
        for batch in _batches(user_id, convs, ids, staged_at, imported_at):
            async with self.db.transaction() as tx:
                await tx.executemany(
                    "INSERT INTO conversations (id, user_id, title, system_prompt, created_at,"
                    " updated_at, deleted_at, importing, imported_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?)",
                    batch.conversations,
                )
                await tx.executemany(
                    "INSERT INTO turns (id, conversation_id, parent_id, role, content, status,"
                    " model, created_at) VALUES (?, ?, ?, ?, ?, 'complete', ?, ?)",
                    batch.turns,
                )
                await tx.executemany(
                    "UPDATE conversations SET active_leaf_id = ? WHERE id = ?", batch.leaves
                )
        async with self.db.transaction() as tx:
            shown = 0
            for at in range(0, len(ids), IN_BATCH):
                part = ids[at : at + IN_BATCH]
                marks = ", ".join("?" for _ in part)
                cur = await tx.execute(
                    "UPDATE conversations SET deleted_at = NULL, importing = 0"
                    f" WHERE id IN ({marks}) AND user_id = ? AND importing = 1"
                    " AND erased_at IS NULL",
                    (*part, user_id),
                )
                shown += cur.rowcount
            if shown != len(ids):  # erased while it was written (the account, or a sweep)
                raise ImportLost(f"{len(ids) - shown} of the imported conversations were erased")
        return ids

    async def being_imported(self, since: float) -> set[str]:
        """Hidden conversations of an import started after `since` (still being written)."""
        rows = await self.db.fetchall(
            "SELECT id FROM conversations WHERE importing = 1 AND erased_at IS NULL"
            " AND deleted_at >= ?",
            (since,),
        )
        return {r["id"] for r in rows}

    async def imported_after(self, conv_ids: Sequence[str], since: float) -> set[str]:
        """Those of these conversations imported after `since`."""
        rows = await self.db.fetchall_in(
            "SELECT id FROM conversations WHERE id IN ({marks}) AND imported_at >= ?",
            list(conv_ids),
            (since,),
        )
        return {r["id"] for r in rows}

    # -- zero-data-retention switches -----------------------------------------------------

    async def user_zero_retention(self, user_id: str) -> bool:
        row = await self.db.fetchone("SELECT zero_retention FROM users WHERE id = ?", (user_id,))
        return bool(row and row[0])

    async def zero_retention(self, user_id: str, secret: str | None) -> bool:
        """The user's or the API key's switch is on: one read of the last commit."""
        row = await self.db.snapshot.fetchone(
            "SELECT (SELECT zero_retention FROM users WHERE id = ?),"
            " (SELECT zero_retention FROM api_keys WHERE key_hash = ? AND revoked_at IS NULL)",
            (user_id, hash_token(secret) if secret is not None else ""),
        )
        return bool(row and (row[0] or row[1]))

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
        return bool(cur.rowcount > 0)

    async def content_rows(self) -> dict[str, int]:
        """Rows of every table that holds content (for tools and tests of retention)."""
        out = {}
        for table in ("conversations", "turns", "drafts", "memories", "documents", "chunks"):
            row = await self.db.fetchone(f"SELECT count(*) FROM {table}")
            out[table] = int(row[0])
        return out
