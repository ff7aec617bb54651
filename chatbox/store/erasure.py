"""Erasure: a deleted conversation, account, workspace, document, memory fact or share link
loses its content and everything made from it.

Which rows each erasure takes, and how, is declared in the content registry
(`chatbox.store.content`); this module runs it, one transaction per call. A conversation keeps
only its row as a tombstone (id, owner, created, erased); an account keeps a nameless row so
that its usage (counts only) stays attributed. With the connection's `secure_delete` and
FTS5's `secure-delete` the words are zeroed, not freed; `Database.checkpoint` then moves them
out of the WAL before the erasure returns.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from chatbox.store import content
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


def _bound(sql: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The named parameters `sql` uses, taken from `params` (sqlite3 refuses extra names)."""
    return {k: v for k, v in params.items() if f":{k}" in sql}


async def _rows(tx: Any, sql: str, params: Mapping[str, Any]) -> list[Any]:
    async with tx.execute(sql, _bound(sql, params)) as cur:
        return list(await cur.fetchall())


async def _apply(
    tx: Any,
    out: Erased,
    kind: content.Kind,
    t: content.Table,
    params: Mapping[str, Any],
    dialect: str,
) -> None:
    """One table's part of one erasure (see `chatbox.store.content`)."""
    act = t.erase[kind]
    if isinstance(act, content.WithParent):
        return
    if isinstance(act, content.DropVectors):
        found = await _rows(tx, act.rows, params)
        await tx.executemany(f"DELETE FROM {t.name} WHERE rowid = ?", [(r[0],) for r in found])
        for rowid, partition in found:
            out.add_vectors(t.name, partition, [rowid])
        return
    if isinstance(act, content.Forget):
        assert t.source is not None and t.virtual == "fts5"
        source, rowid = t.source
        cols = ", ".join(t.content)
        if dialect == "postgresql":  # a tsvector table: its rows go
            sql = f"DELETE FROM {t.name} WHERE rowid IN (SELECT {rowid} FROM {source}"
            sql += f" WHERE {act.where})"
            await tx.execute(sql, _bound(sql, params))
            return
        sql = (
            f"INSERT INTO {t.name} ({t.name}, rowid, {cols})"
            f" SELECT 'delete', {rowid}, {cols} FROM {source} WHERE {act.where}"
        )
        await tx.execute(sql, _bound(sql, params))
        return
    if isinstance(act, content.Blank):
        sql = f"UPDATE {t.name} SET {act.set} WHERE {act.where}"
    else:
        sql = f"DELETE FROM {t.name} WHERE {act.where}"
    cur = await tx.execute(sql, _bound(sql, params))
    if t.counts is not None and t.counts[0] == kind:
        setattr(out, t.counts[1], getattr(out, t.counts[1]) + cur.rowcount)


async def _erase(
    tx: Any, out: Erased, kind: content.Kind, params: Mapping[str, Any], dialect: str
) -> None:
    """Erase one subject of `kind`: its parts first, then its rows of every table that
    declares this kind, in the registry's order. A subject not there (or not the user's,
    or already erased) is left alone."""
    if not await _rows(tx, content.SUBJECT[kind], params):
        return
    for part, query in content.PARTS.get(kind, ()):
        for row in await _rows(tx, query, params):
            row_params = dict(zip(row.keys(), row, strict=True))
            await _erase(tx, out, part, {**params, **row_params}, dialect)
    for t in content.TABLES:
        if kind in t.erase:
            await _apply(tx, out, kind, t, params, dialect)


# The erasures other processes must hear of (their caches in RAM), and the id each names.
JOURNALED: dict[str, str] = {"conversation": "conv", "account": "user"}
JOURNAL_KEEP_S = 24 * 3600.0  # a process that was down longer starts with empty caches


@dataclass(frozen=True)
class Journaled:
    """One erasure as every process reads it: what kind of subject, and its id."""

    seq: int
    kind: str
    subject: str


class ErasureRepo:
    """Every erasure, each one transaction over the content registry, checkpointed before
    it returns so that no erased byte is left in the WAL or a free page."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def run(self, kind: content.Kind, subjects: Sequence[Mapping[str, Any]]) -> Erased:
        """Erase these subjects of one kind (their parameters: see `content.Kind`)."""
        out = Erased()
        now = time.time()
        async with self.db.transaction() as tx:
            for params in subjects:
                await _erase(tx, out, kind, params, self.db.dialect)
                if kind in JOURNALED:
                    await tx.execute(
                        "INSERT INTO erasure_journal (at, kind, subject) VALUES (?, ?, ?)",
                        (now, kind, str(params[JOURNALED[kind]])),
                    )
            await tx.execute("DELETE FROM erasure_journal WHERE at < ?", (now - JOURNAL_KEEP_S,))
        await self._settle(out)
        return out

    async def journal(self, after: int) -> list[Journaled]:
        """Conversations and accounts erased since `after` (a `seq`), by any process."""
        rows = await self.db.fetchall(
            "SELECT seq, kind, subject FROM erasure_journal WHERE seq > ? ORDER BY seq",
            (after,),
        )
        return [Journaled(int(r["seq"]), r["kind"], r["subject"]) for r in rows]

    async def journal_end(self) -> int:
        """The last erasure's `seq` (0: none kept)."""
        row = await self.db.fetchone("SELECT COALESCE(MAX(seq), 0) AS seq FROM erasure_journal")
        return int(row["seq"])

    async def conversations(
        self, user_id: str, conv_ids: Sequence[str], now: float | None = None
    ) -> Erased:
        """Erase these conversations of this user (others' ids are ignored), atomically."""
        when = time.time() if now is None else now
        return await self.run(
            "conversation", [{"user": user_id, "conv": c, "now": when} for c in conv_ids]
        )

    async def account(self, user_id: str, now: float | None = None) -> Erased:
        """Erase everything the account owns; its row stays, nameless and unable to log in."""
        when = time.time() if now is None else now
        return await self.run("account", [{"user": user_id, "now": when}])

    async def workspace(self, ws_id: str) -> Erased:
        """Erase a workspace's documents and drop it with its memberships (its conversations
        are erased first, each by its owner's erasure, which also stops answers and KV)."""
        return await self.run("workspace", [{"ws": ws_id}])

    async def documents(self, doc_ids: Sequence[str]) -> Erased:
        return await self.run("document", [{"doc": d} for d in doc_ids])

    async def memories(self, seqs: Sequence[int]) -> Erased:
        return await self.run("memory", [{"memory": s} for s in seqs])

    async def shares(self, share_ids: Sequence[str]) -> Erased:
        return await self.run("share", [{"share": s} for s in share_ids])

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
        # Always: the WAL still holds the erased rows' pages until they are checkpointed.
        await self.db.checkpoint()
