"""Vector partitions: one user's vectors of a vec0 table, read whole.

`VectorRepo.partition` reads one (table, user) partition in one go (the knowledge layer's
in-RAM index loads it; `chatbox.store.vector_feed` keeps it in step after that). On
PostgreSQL the vector tables are plain rows, and `VectorRepo.nearest` scans a partition
where the index does not hold it.
"""

from __future__ import annotations

import re

import numpy as np

from chatbox.store.db import Database, SqliteDatabase

VECTOR_TABLES = frozenset({"memory_vec", "chunk_vec", "turn_vec"})
DIM = 384
# sqlite-vec versions whose shadow-table layout `_partition_fast` understands.
_FAST_VERSIONS = re.compile(r"^v0\.1\.\d+$")


class VectorRepo:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._fast: bool | None = None

    async def partition(
        self, table: str, user_id: str, max_rows: int | None = None
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """(rowids int64[n], vectors float32[n, 384]) of one user's partition, read under the
        writer lock (no write interleaves); None when it holds more than max_rows rows."""
        if table not in VECTOR_TABLES:
            raise ValueError(f"not a vector table: {table}")
        if not isinstance(self.db, SqliteDatabase):  # one statement: one snapshot
            return await self._partition_rows(table, user_id, max_rows)
        async with self.db.reading():
            if await self._fast_ok():
                return await self._partition_fast(table, user_id, max_rows)
            return await self._partition_plain(table, user_id, max_rows)

    async def nearest(
        self, table: str, user_id: str, vector: np.ndarray, k: int
    ) -> list[tuple[int, float]]:
        """The k rows of one partition nearest to `vector` as (rowid, L2 distance), nearest
        first: a brute-force scan (PostgreSQL's answer where the in-RAM index has none)."""
        loaded = await self.partition(table, user_id)
        if loaded is None or k <= 0 or not len(loaded[0]):
            return []
        ids, mat = loaded
        q = np.asarray(vector, dtype=np.float32).reshape(-1)
        dist = np.sqrt(((mat.astype(np.float64) - q.astype(np.float64)) ** 2).sum(axis=1))
        order = np.lexsort((ids, dist))[:k]
        return [(int(ids[i]), float(dist[i])) for i in order]

    async def _partition_rows(
        self, table: str, user_id: str, max_rows: int | None
    ) -> tuple[np.ndarray, np.ndarray] | None:
        rows = await self.db.fetchall(
            f"SELECT rowid, embedding FROM {table} WHERE user_id = ? ORDER BY rowid", (user_id,)
        )
        if max_rows is not None and len(rows) > max_rows:
            return None
        mat = np.frombuffer(b"".join(bytes(r[1]) for r in rows), dtype=np.float32)
        ids = np.asarray([int(r[0]) for r in rows], dtype=np.int64)
        return ids, mat.reshape(-1, DIM).copy()

    async def count(self, table: str, user_id: str) -> int:
        """Rows in one user's partition (a full vec0 scan: for tests and tools)."""
        if table not in VECTOR_TABLES:
            raise ValueError(f"not a vector table: {table}")
        row = await self.db.fetchone(f"SELECT count(*) FROM {table} WHERE user_id = ?", (user_id,))
        return int(row[0])

    async def _fast_ok(self) -> bool:
        if self._fast is None:
            row = await self.db.fetchone("SELECT vec_version()")
            self._fast = bool(row and _FAST_VERSIONS.match(str(row[0])))
        return self._fast

    async def _partition_fast(
        self, table: str, user_id: str, max_rows: int | None
    ) -> tuple[np.ndarray, np.ndarray] | None:
        # vec0 keeps each partition's vectors in chunks: `{table}_chunks` rows hold a validity
        # bitmap and the slots' rowids, `{table}_vector_chunks00` the slots' vectors, in order.
        # Reading them whole is ~100x faster than a vec0 scan (which visits every partition).
        chunks = await self.db.fetchall(
            f"SELECT chunk_id, validity, rowids FROM {table}_chunks WHERE partition00 = ?"
            " ORDER BY chunk_id",
            (user_id,),
        )
        masks, ids = [], []
        for chunk in chunks:
            rowids = np.frombuffer(chunk["rowids"], dtype=np.int64)
            bits = np.unpackbits(
                np.frombuffer(chunk["validity"], dtype=np.uint8), bitorder="little"
            )[: len(rowids)].astype(bool)
            masks.append(bits)
            ids.append(rowids[bits])
        n = sum(len(i) for i in ids)
        if max_rows is not None and n > max_rows:
            return None
        out = np.empty((n, DIM), dtype=np.float32)
        at = 0
        for chunk, bits, rowids in zip(chunks, masks, ids, strict=True):
            if not len(rowids):
                continue
            row = await self.db.fetchone(
                f"SELECT vectors FROM {table}_vector_chunks00 WHERE rowid = ?", (chunk["chunk_id"],)
            )
            slots = np.frombuffer(row["vectors"], dtype=np.float32).reshape(-1, DIM)
            out[at : at + len(rowids)] = slots[: len(bits)][bits]
            at += len(rowids)
        all_ids = np.concatenate(ids) if ids else np.empty(0, dtype=np.int64)
        return all_ids.astype(np.int64, copy=True), out

    async def _partition_plain(
        self, table: str, user_id: str, max_rows: int | None
    ) -> tuple[np.ndarray, np.ndarray] | None:
        ids: list[int] = []
        parts: list[bytes] = []
        assert isinstance(self.db, SqliteDatabase)
        async with self.db.conn.execute(
            f"SELECT rowid, embedding FROM {table} WHERE user_id = ?", (user_id,)
        ) as cur:
            while rows := await cur.fetchmany(4096):
                ids.extend(int(r[0]) for r in rows)
                parts.extend(bytes(r[1]) for r in rows)
                if max_rows is not None and len(ids) > max_rows:
                    return None
        mat = np.frombuffer(b"".join(parts), dtype=np.float32).reshape(-1, DIM).copy()
        return np.asarray(ids, dtype=np.int64), mat
