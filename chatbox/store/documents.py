"""Documents: uploaded files as chunks of text, each chunk with a vector (`chunk_vec`) and an
FTS5 entry (`chunk_fts`); a document is stored whole in one transaction or not at all."""

from __future__ import annotations

import builtins
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from chatbox.store.db import Database
from chatbox.store.erasure import ErasureRepo
from chatbox.store.memories import vector_blob
from chatbox.store.pg_text import tsquery
from chatbox.store.records import new_id
from chatbox.store.vector_feed import VectorChange
from chatbox.store.vectors import VectorRepo
from chatbox.store.visibility import visible_to


@dataclass(frozen=True)
class Document:
    id: str
    user_id: str
    conversation_id: str | None  # None: the user's library, seen from every conversation
    name: str
    mime: str
    size_bytes: int
    pages: int | None
    chars: int
    chunks: int
    created_at: float
    workspace_id: str | None = None  # its workspace's library (or a workspace conversation's)

    @classmethod
    def from_row(cls, row: Any) -> Document:
        return cls(
            row["id"],
            row["user_id"],
            row["conversation_id"],
            row["name"],
            row["mime"],
            row["size_bytes"],
            row["pages"],
            row["chars"],
            row["n_chunks"],
            row["created_at"],
            row["workspace_id"] if "workspace_id" in row.keys() else None,  # noqa: SIM118 (a Row)
        )


@dataclass(frozen=True)
class ChunkIn:
    ord: int
    page: int | None
    start_char: int
    text: str


@dataclass(frozen=True)
class Chunk:
    seq: int
    document_id: str
    document_name: str
    ord: int
    page: int | None
    text: str

    @classmethod
    def from_row(cls, row: Any) -> Chunk:
        return cls(
            row["seq"], row["document_id"], row["name"], row["ord"], row["page"], row["text"]
        )


_DOC = (
    "SELECT documents.*, (SELECT count(*) FROM chunks WHERE document_id = documents.id)"
    " AS n_chunks FROM documents"
)
_CHUNK_COLS = (
    "SELECT chunks.seq, chunks.document_id, chunks.ord, chunks.page, chunks.text, documents.name"
)
_CHUNK = f"{_CHUNK_COLS} FROM chunks JOIN documents ON documents.id = chunks.document_id"
# Chunks a turn in conversation ? may draw on: that conversation's and the library's, of the
# user (personal documents only) or, for the partition `library_owner(ws)`, of the workspace.
_OF_CONV = "(documents.conversation_id IS NULL OR documents.conversation_id = ?)"


def _in_scope(owner: str, conversation_id: str) -> tuple[str, tuple[str, str]]:
    if owner.startswith("ws:"):
        return f"documents.workspace_id = ? AND {_OF_CONV}", (owner[3:], conversation_id)
    return (
        f"documents.user_id = ? AND documents.workspace_id IS NULL AND {_OF_CONV}",
        (owner, conversation_id),
    )


def library_owner(workspace_id: str | None, user_id: str) -> str:
    """Whose vectors (the chunk_vec partition) a document's chunks join: its workspace's
    (shared by every member, and by no one's personal retrieval) or the user's."""
    return f"ws:{workspace_id}" if workspace_id else user_id


class DocumentRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def create(
        self,
        user_id: str,
        conversation_id: str | None,
        name: str,
        mime: str,
        size_bytes: int,
        pages: int | None,
        chunks: Sequence[ChunkIn],
        vectors: np.ndarray,
        workspace_id: str | None = None,
    ) -> Document:
        """Store a document with all its chunks and vectors, atomically."""
        assert len(chunks) == len(vectors)
        owner = library_owner(workspace_id, user_id)
        doc_id = new_id("d")
        chars = sum(len(c.text) for c in chunks)
        seqs: builtins.list[int] = []
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO documents (id, user_id, conversation_id, name, mime, size_bytes,"
                " pages, chars, created_at, workspace_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    doc_id,
                    user_id,
                    conversation_id,
                    name,
                    mime,
                    size_bytes,
                    pages,
                    chars,
                    time.time(),
                    workspace_id,
                ),
            )
            for chunk, vector in zip(chunks, vectors, strict=True):
                cur = await tx.execute(
                    "INSERT INTO chunks (document_id, user_id, ord, page, start_char, text)"
                    " VALUES (?, ?, ?, ?, ?, ?) RETURNING seq",
                    (doc_id, owner, chunk.ord, chunk.page, chunk.start_char, chunk.text),
                )
                seqs.append(int((await cur.fetchone())[0]))
                await tx.execute(
                    "INSERT INTO chunk_vec (rowid, user_id, embedding) VALUES (?, ?, ?)",
                    (seqs[-1], owner, vector_blob(vector)),
                )
        await self.db.vector_changes.publish(
            VectorChange("chunk_vec", owner, seqs, np.asarray(vectors, dtype=np.float32))
        )
        doc = await self.get(user_id, doc_id)
        assert doc is not None
        return doc

    async def get(self, user_id: str, doc_id: str) -> Document | None:
        """A document the user may see: their own, or one of a workspace they belong to."""
        seen, params = visible_to(user_id, "documents")
        row = await self.db.fetchone(f"{_DOC} WHERE id = ? AND {seen}", (doc_id, *params))
        return Document.from_row(row) if row else None

    async def totals(self, user_id: str) -> tuple[int, int]:
        """How many documents the user keeps, and their uploaded bytes in all."""
        row = await self.db.fetchone(
            "SELECT count(*), coalesce(sum(size_bytes), 0) FROM documents WHERE user_id = ?",
            (user_id,),
        )
        return (int(row[0]), int(row[1])) if row else (0, 0)

    async def list(
        self, user_id: str, conversation_id: str | None = None, library: bool = False
    ) -> builtins.list[Document]:
        """The user's personal documents: all, or (library=True) the library's; or those
        attached to one conversation they see (a workspace one's: every member's)."""
        sql, params = f"{_DOC} WHERE user_id = ? AND workspace_id IS NULL", [user_id]
        if library:
            sql += " AND conversation_id IS NULL"
        elif conversation_id is not None:
            seen, both = visible_to(user_id, "documents")
            sql, params = f"{_DOC} WHERE conversation_id = ? AND {seen}", [conversation_id, *both]
        rows = await self.db.fetchall(sql + " ORDER BY created_at DESC", params)
        return [Document.from_row(r) for r in rows]

    async def delete(self, user_id: str, doc_id: str) -> bool:
        """Erase a document the user sees (a workspace's: any member); its chunks, vectors,
        FTS rows and citations go with it."""
        doc = await self.get(user_id, doc_id)
        if doc is None:
            return False
        return (await ErasureRepo(self.db).documents([doc.id])).documents > 0

    async def of_workspace(self, workspace_id: str) -> builtins.list[Document]:
        """A workspace's library (not its conversations' attachments), newest first."""
        rows = await self.db.fetchall(
            f"{_DOC} WHERE workspace_id = ? AND conversation_id IS NULL ORDER BY created_at DESC",
            (workspace_id,),
        )
        return [Document.from_row(r) for r in rows]

    async def chunks(self, user_id: str, doc_id: str) -> builtins.list[Chunk]:
        seen, params = visible_to(user_id, "documents")
        rows = await self.db.fetchall(
            f"{_CHUNK} WHERE documents.id = ? AND {seen} ORDER BY chunks.ord", (doc_id, *params)
        )
        return [Chunk.from_row(r) for r in rows]

    async def chunk(self, user_id: str, chunk_seq: int) -> Chunk | None:
        seen, params = visible_to(user_id, "documents")
        row = await self.db.fetchone(
            f"{_CHUNK} WHERE chunks.seq = ? AND {seen}", (chunk_seq, *params)
        )
        return Chunk.from_row(row) if row else None

    async def has_any(self, user_id: str, conversation_id: str) -> bool:
        scope, params = _in_scope(user_id, conversation_id)
        row = await self.db.fetchone(f"SELECT 1 FROM documents WHERE {scope} LIMIT 1", params)
        return row is not None

    async def nearest_chunks(
        self, user_id: str, conversation_id: str, vector: np.ndarray, k: int
    ) -> builtins.list[tuple[Chunk, float]]:
        """The k chunks nearest to vector among those in scope, with L2 distances.

        `user_id` is the partition (`library_owner`). The KNN runs in it; chunks of other
        conversations' documents are filtered after it, so it over-fetches to still return k
        in the common case.
        """
        scope, params = _in_scope(user_id, conversation_id)
        if self.db.dialect == "postgresql":  # no vec0: a scan of the partition, then scope
            found = await VectorRepo(self.db).nearest("chunk_vec", user_id, vector, k * 4)
            chunks = await self.chunks_in_scope(user_id, conversation_id, [s for s, _ in found])
            return [(chunks[s], d) for s, d in found if s in chunks][:k]
        rows = await self.db.fetchall(
            "WITH knn AS (SELECT rowid, distance FROM chunk_vec"
            " WHERE embedding MATCH ? AND k = ? AND user_id = ?)"
            f" {_CHUNK_COLS}, knn.distance FROM knn JOIN chunks ON chunks.seq = knn.rowid"
            f" JOIN documents ON documents.id = chunks.document_id WHERE {scope}"
            " ORDER BY knn.distance LIMIT ?",
            (vector_blob(vector), k * 4, user_id, *params, k),
        )
        return [(Chunk.from_row(r), float(r["distance"])) for r in rows]

    async def chunks_in_scope(
        self, user_id: str, conversation_id: str, seqs: Sequence[int]
    ) -> dict[int, Chunk]:
        """The chunks with these seqs that a turn in this conversation may draw on."""
        scope, params = _in_scope(user_id, conversation_id)
        rows = await self.db.fetchall_in(
            f"{_CHUNK} WHERE chunks.seq IN ({{marks}}) AND {scope}", seqs, params
        )
        return {int(r["seq"]): Chunk.from_row(r) for r in rows}

    async def keyword_chunks(
        self, user_id: str, conversation_id: str, match: str, k: int
    ) -> builtins.list[tuple[Chunk, float]]:
        """Chunks in scope matching an FTS5 query, best bm25 first (lower is better)."""
        scope, params = _in_scope(user_id, conversation_id)
        if self.db.dialect == "postgresql":
            rows = await self.db.fetchall(
                f"{_CHUNK} JOIN chunk_fts ON chunk_fts.rowid = chunks.seq,"
                " to_tsquery('english', ?) AS q"
                f" WHERE chunk_fts.text @@ q AND {scope}"
                " ORDER BY ts_rank(chunk_fts.text, q) DESC, chunks.seq LIMIT ?",
                (tsquery(match), *params, k),
            )
            return [(Chunk.from_row(r), float(i)) for i, r in enumerate(rows)]
        rows = await self.db.fetchall(
            f"{_CHUNK} JOIN chunk_fts ON chunk_fts.rowid = chunks.seq"
            f" WHERE chunk_fts MATCH ? AND {scope} ORDER BY chunk_fts.rank LIMIT ?",
            (match, *params, k),
        )
        return [(Chunk.from_row(r), float(i)) for i, r in enumerate(rows)]

    # -- citations ------------------------------------------------------------------------

    async def cite(self, turn_id: str, cited: Sequence[tuple[int, float]]) -> None:
        """Record which chunks (seq, score) an answer drew on, in order; nothing for an
        answer or a chunk erased meanwhile (its conversation or document deleted)."""
        async with self.db.transaction() as tx:
            for i, (chunk_seq, score) in enumerate(cited):
                await tx.execute(
                    ("INSERT OR IGNORE" if self.db.dialect == "sqlite" else "INSERT")
                    + " INTO turn_citations (turn_id, chunk_seq, ord, score)"
                    " SELECT CAST(? AS TEXT), CAST(? AS BIGINT), CAST(? AS BIGINT),"
                    " CAST(? AS DOUBLE PRECISION)"
                    " WHERE EXISTS (SELECT 1 FROM turns WHERE id = ?)"
                    " AND EXISTS (SELECT 1 FROM chunks WHERE seq = ?)"
                    + ("" if self.db.dialect == "sqlite" else " ON CONFLICT DO NOTHING"),
                    (turn_id, chunk_seq, i, score, turn_id, chunk_seq),
                )

    async def citations(
        self, user_id: str, turn_ids: Sequence[str]
    ) -> dict[str, builtins.list[Chunk]]:
        """For each turn, the chunks it cited that still exist (that the user may see)."""
        out: dict[str, builtins.list[Chunk]] = {t: [] for t in turn_ids}
        if not turn_ids:
            return out
        marks = ", ".join("?" for _ in turn_ids)
        rows = await self.db.fetchall(
            f"{_CHUNK_COLS}, tc.turn_id FROM turn_citations tc"
            " JOIN chunks ON chunks.seq = tc.chunk_seq"
            " JOIN documents ON documents.id = chunks.document_id"
            f" WHERE tc.turn_id IN ({marks}) AND {visible_to(user_id, 'documents')[0]}"
            " ORDER BY tc.turn_id, tc.ord",
            (*turn_ids, user_id, user_id),
        )
        for r in rows:
            out[r["turn_id"]].append(Chunk.from_row(r))
        return out
