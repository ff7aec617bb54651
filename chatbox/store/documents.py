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
from chatbox.store.memories import vector_blob
from chatbox.store.records import new_id
from chatbox.store.vector_feed import VectorChange


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
# Chunks a turn in conversation ? may draw on: that conversation's and the library's.
_IN_SCOPE = (
    "documents.user_id = ? AND (documents.conversation_id IS NULL OR documents.conversation_id = ?)"
)


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
    ) -> Document:
        """Store a document with all its chunks and vectors, atomically."""
        assert len(chunks) == len(vectors)
        doc_id = new_id("d")
        chars = sum(len(c.text) for c in chunks)
        seqs: builtins.list[int] = []
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO documents (id, user_id, conversation_id, name, mime, size_bytes,"
                " pages, chars, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                ),
            )
            for chunk, vector in zip(chunks, vectors, strict=True):
                cur = await tx.execute(
                    "INSERT INTO chunks (document_id, user_id, ord, page, start_char, text)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (doc_id, user_id, chunk.ord, chunk.page, chunk.start_char, chunk.text),
                )
                seqs.append(int(cur.lastrowid or 0))
                await tx.execute(
                    "INSERT INTO chunk_vec (rowid, user_id, embedding) VALUES (?, ?, ?)",
                    (seqs[-1], user_id, vector_blob(vector)),
                )
        await self.db.vector_changes.publish(
            VectorChange("chunk_vec", user_id, seqs, np.asarray(vectors, dtype=np.float32))
        )
        doc = await self.get(user_id, doc_id)
        assert doc is not None
        return doc

    async def get(self, user_id: str, doc_id: str) -> Document | None:
        row = await self.db.fetchone(f"{_DOC} WHERE id = ? AND user_id = ?", (doc_id, user_id))
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
        """The user's documents: all, one conversation's, or (library=True) the library's."""
        sql, params = f"{_DOC} WHERE user_id = ?", [user_id]
        if library:
            sql += " AND conversation_id IS NULL"
        elif conversation_id is not None:
            sql += " AND conversation_id = ?"
            params.append(conversation_id)
        rows = await self.db.fetchall(sql + " ORDER BY created_at DESC", params)
        return [Document.from_row(r) for r in rows]

    async def delete(self, user_id: str, doc_id: str) -> bool:
        """Delete a document; its chunks, vectors, FTS rows and citations go with it."""
        async with self.db.transaction() as tx:
            async with tx.execute(
                "SELECT seq FROM chunks WHERE document_id = ? AND user_id = ?", (doc_id, user_id)
            ) as found:
                seqs = [int(r[0]) for r in await found.fetchall()]
            cur = await tx.execute(
                "DELETE FROM chunks WHERE document_id = ? AND user_id = ?", (doc_id, user_id)
            )
            cur = await tx.execute(
                "DELETE FROM documents WHERE id = ? AND user_id = ?", (doc_id, user_id)
            )
        await self.db.vector_changes.publish(VectorChange("chunk_vec", user_id, deleted=seqs))
        return cur.rowcount > 0

    async def chunks(self, user_id: str, doc_id: str) -> builtins.list[Chunk]:
        rows = await self.db.fetchall(
            f"{_CHUNK} WHERE documents.id = ? AND documents.user_id = ? ORDER BY chunks.ord",
            (doc_id, user_id),
        )
        return [Chunk.from_row(r) for r in rows]

    async def chunk(self, user_id: str, chunk_seq: int) -> Chunk | None:
        row = await self.db.fetchone(
            f"{_CHUNK} WHERE chunks.seq = ? AND documents.user_id = ?", (chunk_seq, user_id)
        )
        return Chunk.from_row(row) if row else None

    async def has_any(self, user_id: str, conversation_id: str) -> bool:
        row = await self.db.fetchone(
            f"SELECT 1 FROM documents WHERE {_IN_SCOPE} LIMIT 1", (user_id, conversation_id)
        )
        return row is not None

    async def nearest_chunks(
        self, user_id: str, conversation_id: str, vector: np.ndarray, k: int
    ) -> builtins.list[tuple[Chunk, float]]:
        """The k chunks nearest to vector among those in scope, with L2 distances.

        The KNN runs in the user's partition; chunks of other conversations' documents are
        filtered after it, so it over-fetches to still return k in the common case.
        """
        rows = await self.db.fetchall(
            "WITH knn AS (SELECT rowid, distance FROM chunk_vec"
            " WHERE embedding MATCH ? AND k = ? AND user_id = ?)"
            f" {_CHUNK_COLS}, knn.distance FROM knn JOIN chunks ON chunks.seq = knn.rowid"
            f" JOIN documents ON documents.id = chunks.document_id WHERE {_IN_SCOPE}"
            " ORDER BY knn.distance LIMIT ?",
            (vector_blob(vector), k * 4, user_id, user_id, conversation_id, k),
        )
        return [(Chunk.from_row(r), float(r["distance"])) for r in rows]

    async def chunks_in_scope(
        self, user_id: str, conversation_id: str, seqs: Sequence[int]
    ) -> dict[int, Chunk]:
        """The chunks with these seqs that a turn in this conversation may draw on."""
        rows = await self.db.fetchall_in(
            f"{_CHUNK} WHERE chunks.seq IN ({{marks}}) AND {_IN_SCOPE}",
            seqs,
            (user_id, conversation_id),
        )
        return {int(r["seq"]): Chunk.from_row(r) for r in rows}

    async def keyword_chunks(
        self, user_id: str, conversation_id: str, match: str, k: int
    ) -> builtins.list[tuple[Chunk, float]]:
        """Chunks in scope matching an FTS5 query, best bm25 first (lower is better)."""
        rows = await self.db.fetchall(
            f"{_CHUNK} JOIN chunk_fts ON chunk_fts.rowid = chunks.seq"
            f" WHERE chunk_fts MATCH ? AND {_IN_SCOPE} ORDER BY chunk_fts.rank LIMIT ?",
            (match, user_id, conversation_id, k),
        )
        return [(Chunk.from_row(r), float(i)) for i, r in enumerate(rows)]

    # -- citations ------------------------------------------------------------------------

    async def cite(self, turn_id: str, cited: Sequence[tuple[int, float]]) -> None:
        """Record which chunks (seq, score) an answer drew on, in order."""
        async with self.db.transaction() as tx:
            for i, (chunk_seq, score) in enumerate(cited):
                await tx.execute(
                    "INSERT OR IGNORE INTO turn_citations (turn_id, chunk_seq, ord, score)"
                    " VALUES (?, ?, ?, ?)",
                    (turn_id, chunk_seq, i, score),
                )

    async def citations(
        self, user_id: str, turn_ids: Sequence[str]
    ) -> dict[str, builtins.list[Chunk]]:
        """For each turn, the chunks it cited that still exist (this user's only)."""
        out: dict[str, builtins.list[Chunk]] = {t: [] for t in turn_ids}
        if not turn_ids:
            return out
        marks = ", ".join("?" for _ in turn_ids)
        rows = await self.db.fetchall(
            f"{_CHUNK_COLS}, tc.turn_id FROM turn_citations tc"
            " JOIN chunks ON chunks.seq = tc.chunk_seq"
            " JOIN documents ON documents.id = chunks.document_id"
            f" WHERE tc.turn_id IN ({marks}) AND documents.user_id = ?"
            " ORDER BY tc.turn_id, tc.ord",
            (*turn_ids, user_id),
        )
        for r in rows:
            out[r["turn_id"]].append(Chunk.from_row(r))
        return out
