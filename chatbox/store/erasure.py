"""Erasure: a deleted conversation or account loses its content and everything made from it.

A conversation keeps only its row as a tombstone (id, owner, created, erased); its turns,
drafts, search rows, vectors, citations, attachments (chunks, their search rows and
vectors) and the memory facts extracted from it are deleted in one transaction. An account
keeps a nameless row so that its usage (counts only) stays attributed. With the
connection's `secure_delete` and FTS5's `secure-delete` the words are zeroed, not freed;
`Database.checkpoint` then moves them out of the WAL.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiosqlite

from chatbox.store.db import Database
from chatbox.store.vector_feed import VectorChange


@dataclass
class Erased:
    """What one erasure removed (counts, and the vector rowids the in-RAM index must drop)."""

    conversations: int = 0
    turns: int = 0
    documents: int = 0
    memories: int = 0
    vectors: dict[tuple[str, str], list[int]] = field(default_factory=dict)

    def add(self, other: Erased) -> Erased:
        """This and `other` together (counts summed, vectors joined)."""
        self.conversations += other.conversations
        self.turns += other.turns
        self.documents += other.documents
        self.memories += other.memories
        for key, rowids in other.vectors.items():
            self.add_vectors(*key, rowids)
        return self

    def add_vectors(self, table: str, user_id: str, rowids: Sequence[int]) -> None:
        if rowids:
            self.vectors.setdefault((table, user_id), []).extend(rowids)


@dataclass(frozen=True)
class Idle:
    """A conversation retention would erase: it has been quiet since `updated_at`."""

    id: str
    user_id: str
    user_name: str
    updated_at: float


async def _column(tx: aiosqlite.Connection, sql: str, params: Sequence[Any]) -> list[Any]:
    async with tx.execute(sql, tuple(params)) as cur:
        return [r[0] for r in await cur.fetchall()]


async def _drop_vectors(
    tx: aiosqlite.Connection, out: Erased, table: str, user_id: str, rowids: list[int]
) -> None:
    await tx.executemany(f"DELETE FROM {table} WHERE rowid = ?", [(r,) for r in rowids])
    out.add_vectors(table, user_id, rowids)


async def _drop_documents(
    tx: aiosqlite.Connection, out: Erased, user_id: str, doc_ids: list[str]
) -> None:
    for doc_id in doc_ids:
        async with tx.execute(
            "SELECT seq, user_id FROM chunks WHERE document_id = ?", (doc_id,)
        ) as c:
            rows = list(await c.fetchall())
        # The chunks' delete trigger removes their FTS rows and vectors; citations cascade.
        await tx.execute("DELETE FROM chunks WHERE document_id = ?", (doc_id,))
        await tx.execute("DELETE FROM documents WHERE id = ?", (doc_id,))
        # A workspace document's vectors live in the workspace's partition, not the user's.
        out.add_vectors("chunk_vec", rows[0][1] if rows else user_id, [r[0] for r in rows])
        out.documents += 1


async def _erase_one(
    tx: aiosqlite.Connection, out: Erased, user_id: str, conv_id: str, now: float
) -> None:
    cur = await tx.execute(
        "UPDATE conversations SET title = NULL, system_prompt = NULL, model = NULL,"
        " active_leaf_id = NULL, deleted_at = coalesce(deleted_at, ?), erased_at = ?,"
        " updated_at = ? WHERE id = ? AND user_id = ? AND erased_at IS NULL",
        (now, now, now, conv_id, user_id),
    )
    if cur.rowcount == 0:
        return
    out.conversations += 1
    seqs = await _column(tx, "SELECT seq FROM turns WHERE conversation_id = ?", (conv_id,))
    # An external-content FTS5 table forgets a row only when told its old text.
    await tx.execute(
        "INSERT INTO turn_fts (turn_fts, rowid, content)"
        " SELECT 'delete', seq, content FROM turns WHERE conversation_id = ?",
        (conv_id,),
    )
    await _drop_vectors(tx, out, "turn_vec", user_id, seqs)
    await tx.execute(
        "DELETE FROM turn_citations WHERE turn_id IN"
        " (SELECT id FROM turns WHERE conversation_id = ?)",
        (conv_id,),
    )
    await tx.execute("DELETE FROM drafts WHERE conversation_id = ?", (conv_id,))
    await tx.execute("DELETE FROM turns WHERE conversation_id = ?", (conv_id,))
    out.turns += len(seqs)
    docs = await _column(
        tx, "SELECT id FROM documents WHERE conversation_id = ? AND user_id = ?", (conv_id, user_id)
    )
    await _drop_documents(tx, out, user_id, docs)
    facts = await _column(
        tx,
        "SELECT seq FROM memories WHERE conversation_id = ? AND user_id = ?"
        " AND source = 'extracted'",
        (conv_id, user_id),
    )
    await _drop_vectors(tx, out, "memory_vec", user_id, facts)
    await tx.executemany("DELETE FROM memories WHERE seq = ?", [(s,) for s in facts])
    out.memories += len(facts)
    await tx.execute("DELETE FROM memory_extractions WHERE conversation_id = ?", (conv_id,))


class ErasureRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def conversations(
        self, user_id: str, conv_ids: Sequence[str], now: float | None = None
    ) -> Erased:
        """Erase these conversations of this user (others' ids are ignored), atomically."""
        out = Erased()
        when = time.time() if now is None else now
        async with self.db.transaction() as tx:
            for conv_id in conv_ids:
                await _erase_one(tx, out, user_id, conv_id, when)
        await self._settle(out)
        return out

    async def account(self, user_id: str, now: float | None = None) -> Erased:
        """Erase everything the account owns; its row stays, nameless and unable to log in."""
        out = Erased()
        when = time.time() if now is None else now
        async with self.db.transaction() as tx:
            convs = await _column(
                tx,
                "SELECT id FROM conversations WHERE user_id = ? AND erased_at IS NULL",
                (user_id,),
            )
            for conv_id in convs:
                await _erase_one(tx, out, user_id, conv_id, when)
            docs = await _column(tx, "SELECT id FROM documents WHERE user_id = ?", (user_id,))
            await _drop_documents(tx, out, user_id, docs)
            facts = await _column(tx, "SELECT seq FROM memories WHERE user_id = ?", (user_id,))
            await _drop_vectors(tx, out, "memory_vec", user_id, facts)
            await tx.execute("DELETE FROM memories WHERE user_id = ?", (user_id,))
            out.memories += len(facts)
            for table in ("turn_vec", "chunk_vec", "memory_vec"):  # any row left unindexed
                rest = await _column(tx, f"SELECT rowid FROM {table} WHERE user_id = ?", (user_id,))
                await _drop_vectors(tx, out, table, user_id, rest)
            # Share links (their snapshots cascade) and workspace memberships go too.
            for table in ("turn_vec_progress", "sessions", "api_keys", "shares"):
                await tx.execute(f"DELETE FROM {table} WHERE user_id = ?", (user_id,))
            await tx.execute("DELETE FROM workspace_members WHERE user_id = ?", (user_id,))
            await tx.execute(
                "UPDATE users SET name = 'deleted:' || id, password_hash = NULL, disabled = 1,"
                " role = 'member', zero_retention = 0, deleted_at = ? WHERE id = ?",
                (when, user_id),
            )
        await self._settle(out)
        return out

    async def workspace_documents(self, ws_id: str) -> Erased:
        """Erase a workspace's documents: its library and its conversations' attachments."""
        out = Erased()
        async with self.db.transaction() as tx:
            docs = await _column(tx, "SELECT id FROM documents WHERE workspace_id = ?", (ws_id,))
            await _drop_documents(tx, out, f"ws:{ws_id}", docs)
        await self._settle(out)
        return out

    async def pending(self) -> list[tuple[str, str]]:
        """(user id, conversation id) deleted but not yet erased (hidden before this
        existed, or a start that failed): the sweeper finishes them."""
        rows = await self.db.fetchall(
            "SELECT user_id, id FROM conversations"
            " WHERE deleted_at IS NOT NULL AND erased_at IS NULL"
        )
        return [(r["user_id"], r["id"]) for r in rows]

    async def idle(self, tier: str, before: float) -> list[Idle]:
        """Live conversations of live accounts in `tier` last active before `before`."""
        rows = await self.db.fetchall(
            "SELECT c.id, c.user_id, u.name, c.updated_at FROM conversations c"
            " JOIN users u ON u.id = c.user_id"
            " WHERE c.deleted_at IS NULL AND u.deleted_at IS NULL AND c.updated_at < ?"
            " AND u.tier = ? ORDER BY c.updated_at",
            (before, tier),
        )
        return [Idle(r["id"], r["user_id"], r["name"], r["updated_at"]) for r in rows]

    async def tiers_in_use(self) -> list[str]:
        rows = await self.db.fetchall(
            "SELECT DISTINCT tier FROM users WHERE deleted_at IS NULL ORDER BY tier"
        )
        return [r[0] for r in rows]

    async def _settle(self, out: Erased) -> None:
        for (table, user_id), rowids in out.vectors.items():
            await self.db.vector_changes.publish(VectorChange(table, user_id, deleted=rowids))
        if out.conversations or out.documents or out.memories or out.vectors:
            await self.db.checkpoint()
