"""Search over the conversations a user may see: FTS5 over turns (`turn_fts`, kept by a
trigger) and turn vectors (`turn_vec`, filled by the knowledge indexer up to a per-user mark,
in the partition of each conversation's starter). Every hit passes `visible_to`. Reads run
on the database's read connection (`snapshot`): a search never queues behind the writes of
answers streaming meanwhile; on PostgreSQL with a read replica, they run there
(`conversation_reads`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from chatbox.store.db import Database, Reader
from chatbox.store.memories import vector_blob
from chatbox.store.pg_text import tsquery
from chatbox.store.vector_feed import VectorChange
from chatbox.store.vectors import VectorRepo
from chatbox.store.visibility import visible_to

HIT_START, HIT_END = "\x02", "\x03"  # snippet markers; the web layer turns them into <mark>


@dataclass(frozen=True)
class TurnHit:
    turn_id: str
    seq: int
    conversation_id: str
    title: str | None
    role: str
    snippet: str  # with HIT_START / HIT_END around matched words (keyword hits)
    score: float  # keyword: bm25 rank (lower is better); vector: L2 distance
    created_at: float

    @classmethod
    def from_row(cls, row: Any) -> TurnHit:
        return cls(
            row["id"],
            row["seq"],
            row["conversation_id"],
            row["title"],
            row["role"],
            row["snippet"],
            float(row["score"]),
            row["created_at"],
        )


def _seen(user_id: str) -> tuple[str, tuple[str, str]]:
    """Live conversations the user may see (the one visibility predicate)."""
    visible, params = visible_to(user_id)
    return f"{visible} AND conversations.deleted_at IS NULL", params


class SearchRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    @property
    def _reads(self) -> Reader:
        """A read replica where one serves conversation reads, else the read connection."""
        replica = self.db.conversation_reads
        return self.db.snapshot if replica is self.db else replica

    async def keyword(self, user_id: str, match: str, limit: int) -> list[TurnHit]:
        """Turns of the live conversations the user may see matching an FTS5 query, best first."""
        seen, params = _seen(user_id)
        if self.db.dialect == "postgresql":
            rows = await self._reads.fetchall(
                "SELECT turns.id, turns.seq, turns.conversation_id, conversations.title,"
                " turns.role, turns.created_at, -ts_rank(turn_fts.content, q) AS score,"
                " ts_headline('english', turns.content, q, 'StartSel="
                + HIT_START
                + ", StopSel="
                + HIT_END
                + ", MaxWords=24, MinWords=8') AS snippet"
                " FROM turn_fts JOIN turns ON turns.seq = turn_fts.rowid"
                " JOIN conversations ON conversations.id = turns.conversation_id,"
                " to_tsquery('english', ?) AS q"
                f" WHERE turn_fts.content @@ q AND {seen} ORDER BY score, turns.seq LIMIT ?",
                (tsquery(match), *params, limit),
            )
            return [TurnHit.from_row(r) for r in rows]
        rows = await self._reads.fetchall(
            "SELECT turns.id, turns.seq, turns.conversation_id, conversations.title,"
            " turns.role, turns.created_at, turn_fts.rank AS score,"
            f" snippet(turn_fts, 0, '{HIT_START}', '{HIT_END}', '…', 24) AS snippet"
            " FROM turn_fts JOIN turns ON turns.seq = turn_fts.rowid"
            " JOIN conversations ON conversations.id = turns.conversation_id"
            f" WHERE turn_fts MATCH ? AND {seen} ORDER BY turn_fts.rank LIMIT ?",
            (match, *params, limit),
        )
        return [TurnHit.from_row(r) for r in rows]

    async def semantic(self, user_id: str, vector: np.ndarray, limit: int) -> list[TurnHit]:
        """Turns of the user's partition (conversations they started) nearest in meaning,
        among those indexed and those they may still see, nearest first."""
        seen, params = _seen(user_id)
        if self.db.dialect == "postgresql":  # no vec0: a scan of the user's partition
            found = await VectorRepo(self.db).nearest("turn_vec", user_id, vector, limit * 2)
            hits = await self.turns_by_seq(user_id, [seq for seq, _ in found])
            return [replace(hits[s], score=d) for s, d in found if s in hits][:limit]
        rows = await self._reads.fetchall(
            "WITH knn AS (SELECT rowid, distance FROM turn_vec"
            " WHERE embedding MATCH ? AND k = ? AND user_id = ?)"
            " SELECT turns.id, turns.seq, turns.conversation_id, conversations.title,"
            " turns.role, turns.created_at, knn.distance AS score,"
            " substr(turns.content, 1, 240) AS snippet"
            " FROM knn JOIN turns ON turns.seq = knn.rowid"
            " JOIN conversations ON conversations.id = turns.conversation_id"
            f" WHERE {seen} ORDER BY knn.distance LIMIT ?",
            (vector_blob(vector), limit * 2, user_id, *params, limit),
        )
        return [TurnHit.from_row(r) for r in rows]

    async def unindexed(self, user_id: str, limit: int) -> list[tuple[int, str]]:
        """(seq, content) of turns not yet embedded in the user's partition (of the
        conversations they started: the indexer's write side; reads filter by visibility)."""
        rows = await self.db.snapshot.fetchall(
            "SELECT turns.seq, turns.content FROM turns"
            " JOIN conversations ON conversations.id = turns.conversation_id"
            " WHERE conversations.user_id = ? AND turns.seq > coalesce("
            "(SELECT last_seq FROM turn_vec_progress WHERE user_id = ?), 0)"
            " ORDER BY turns.seq LIMIT ?",
            (user_id, user_id, limit),
        )
        return [(int(r["seq"]), r["content"]) for r in rows]

    async def add_vectors(
        self, user_id: str, items: Sequence[tuple[int, np.ndarray]], upto_seq: int
    ) -> None:
        """Store turn vectors and move the user's indexed mark to upto_seq."""
        async with self.db.transaction() as tx:
            # Two indexers may race for one user: the mark, read under the write lock, decides.
            async with tx.execute(
                "SELECT last_seq FROM turn_vec_progress WHERE user_id = ?", (user_id,)
            ) as cur:
                row = await cur.fetchone()
            after = int(row["last_seq"]) if row else 0
            # Embedding takes a while: a conversation deleted meanwhile gets no vectors.
            newer = [seq for seq, _ in items if seq > after]
            live: set[int] = set()
            if newer:
                marks = ", ".join("?" for _ in newer)
                async with tx.execute(
                    "SELECT turns.seq FROM turns"
                    " JOIN conversations ON conversations.id = turns.conversation_id"
                    f" WHERE turns.seq IN ({marks}) AND conversations.deleted_at IS NULL",
                    newer,
                ) as cur:
                    live = {int(r["seq"]) for r in await cur.fetchall()}
            added = [(seq, vector) for seq, vector in items if seq in live]
            for seq, vector in added:
                await tx.execute(
                    "INSERT INTO turn_vec (rowid, user_id, embedding) VALUES (?, ?, ?)",
                    (seq, user_id, vector_blob(vector)),
                )
            await tx.execute(
                "INSERT INTO turn_vec_progress (user_id, last_seq) VALUES (?, ?)"
                " ON CONFLICT (user_id) DO UPDATE SET last_seq ="
                + (" max" if self.db.dialect == "sqlite" else " greatest")
                + "(turn_vec_progress.last_seq, excluded.last_seq)",
                (user_id, upto_seq),
            )
        if added:
            await self.db.vector_changes.publish(
                VectorChange(
                    "turn_vec",
                    user_id,
                    [seq for seq, _ in added],
                    np.stack([np.asarray(v, dtype=np.float32) for _, v in added]),
                )
            )

    async def turns_by_seq(self, user_id: str, seqs: Sequence[int]) -> dict[int, TurnHit]:
        """Turns with these seqs in live conversations the user may see; score is left 0."""
        seen, params = _seen(user_id)
        rows = await self._reads.fetchall_in(
            "SELECT turns.id, turns.seq, turns.conversation_id, conversations.title,"
            " turns.role, turns.created_at, 0.0 AS score,"
            " substr(turns.content, 1, 240) AS snippet"
            " FROM turns JOIN conversations ON conversations.id = turns.conversation_id"
            f" WHERE turns.seq IN ({{marks}}) AND {seen}",
            seqs,
            params,
        )
        return {int(r["seq"]): TurnHit.from_row(r) for r in rows}
