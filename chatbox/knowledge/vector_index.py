"""An exact, in-RAM copy of each user's vectors, searched by numpy; SQLite stays the truth.

Each (vec0 table, user) partition is loaded whole on its first query (`VectorRepo.partition`)
into a float32 matrix and kept in step by the store's change notices (every vector write
goes through the store, in this process). Distances are L2, as vec0 computes them, so the
ranking matches a vec0 KNN. Partitions are evicted whole, least recently used first, to stay
within a byte budget; a partition that cannot fit is answered by sqlite-vec (`None` here).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from chatbox.store import Store, VectorChange
from chatbox.store.vectors import DIM

log = logging.getLogger("chatbox.knowledge")
Key = tuple[str, str]  # (vec0 table, user id)
RESCORE = 16  # candidates beyond k re-ranked with exact differences


class Partition:
    """One user's vectors of one table: rows [0, n) of a growable matrix, rowid per row."""

    def __init__(self, rowids: np.ndarray, vectors: np.ndarray) -> None:
        n = len(rowids)
        cap = max(16, n + n // 8)
        self.dim = vectors.shape[1] if vectors.ndim == 2 else DIM
        self.ids = np.zeros(cap, dtype=np.int64)
        self.mat = np.zeros((cap, self.dim), dtype=np.float32)
        self.sq = np.zeros(cap, dtype=np.float32)  # squared norms
        self.n = n
        self.ids[:n] = rowids
        self.mat[:n] = vectors
        self.sq[:n] = np.einsum("ij,ij->i", self.mat[:n], self.mat[:n])
        self.lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return int(self.ids.nbytes + self.mat.nbytes + self.sq.nbytes)

    def search(self, query: np.ndarray, k: int) -> list[tuple[int, float]]:
        """The k nearest rows as (rowid, L2 distance), nearest first."""
        q = np.ascontiguousarray(query, dtype=np.float32).reshape(-1)
        with self.lock:
            n = self.n
            if n == 0 or k <= 0:
                return []
            x = self.mat[:n]
            d2 = self.sq[:n] - 2.0 * (x @ q)  # + |q|², the same for every row
            m = min(n, k + RESCORE)
            cand = np.argpartition(d2, m - 1)[:m] if m < n else np.arange(n)
            # Exact distances for the candidates (as vec0 computes them: sqrt of summed diffs).
            diff = x[cand].astype(np.float64) - q.astype(np.float64)
            dist = np.sqrt(np.einsum("ij,ij->i", diff, diff))
            ids = self.ids[cand]
        order = np.lexsort((ids, dist))[:k]
        return [(int(ids[i]), float(dist[i])) for i in order]

    def apply(self, change: VectorChange) -> None:
        """Rows added or replaced, rows deleted (idempotent: a notice may repeat a state)."""
        with self.lock:
            if len(change.deleted):
                gone = np.flatnonzero(np.isin(self.ids[: self.n], np.asarray(change.deleted)))
                for at in sorted(gone.tolist(), reverse=True):  # swap in the last row
                    last = self.n - 1
                    if at != last:
                        self.ids[at], self.mat[at], self.sq[at] = (
                            self.ids[last],
                            self.mat[last],
                            self.sq[last],
                        )
                    self.n = last
            if len(change.rowids) and change.vectors is not None:
                self._upsert(
                    np.asarray(change.rowids, dtype=np.int64),
                    np.asarray(change.vectors, dtype=np.float32).reshape(-1, self.dim),
                )

    def _upsert(self, rowids: np.ndarray, vectors: np.ndarray) -> None:
        n = self.n
        known = np.isin(rowids, self.ids[:n])
        for rid, vec in zip(rowids[known], vectors[known], strict=True):
            at = int(np.flatnonzero(self.ids[:n] == rid)[0])
            self.mat[at] = vec
            self.sq[at] = float(vec @ vec)
        new_ids, new_vecs = rowids[~known], vectors[~known]
        m = len(new_ids)
        if n + m > len(self.ids):
            cap = max(n + m, len(self.ids) * 3 // 2)
            self.ids = np.resize(self.ids, cap)
            mat = np.zeros((cap, self.dim), dtype=np.float32)
            mat[:n] = self.mat[:n]
            self.mat = mat
            self.sq = np.resize(self.sq, cap)
        self.ids[n : n + m] = new_ids
        self.mat[n : n + m] = new_vecs
        self.sq[n : n + m] = np.einsum("ij,ij->i", new_vecs, new_vecs)
        self.n = n + m


class VectorIndex:
    """Exact top-k over users' vectors in RAM, within `budget_bytes` (0: always sqlite-vec)."""

    def __init__(self, store: Store, budget_bytes: int) -> None:
        self.store = store
        self.budget = max(0, int(budget_bytes))
        self._parts: OrderedDict[Key, Partition] = OrderedDict()  # least recent first
        self._gen: dict[Key, int] = {}  # bumped by every committed change
        self._too_big: set[Key] = set()
        self._loading: dict[Key, asyncio.Lock] = {}
        self._lock = threading.Lock()  # guards _parts between the loop and writer thread
        # One thread applies changes, in commit order; queries run in the default pool.
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="vector-index")
        store.db.vector_changes.subscribe(self._on_change)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(p.nbytes for p in self._parts.values())

    def loaded(self, table: str, user_id: str) -> bool:
        with self._lock:
            return (table, user_id) in self._parts

    async def nearest(
        self, table: str, user_id: str, vector: np.ndarray, k: int
    ) -> list[tuple[int, float]] | None:
        """This user's k nearest rows as (rowid, L2 distance), nearest first; None when the
        partition does not fit the budget (ask sqlite-vec instead)."""
        part = await self._partition((table, user_id))
        if part is None:
            return None
        return await asyncio.to_thread(part.search, vector, k)

    def drop(self, table: str | None = None, user_id: str | None = None) -> None:
        """Forget loaded partitions (all, one table's, or one user's); they reload on use."""
        with self._lock:
            for key in [
                k for k in self._parts if table in (None, k[0]) and user_id in (None, k[1])
            ]:
                del self._parts[key]

    def close(self) -> None:
        self.store.db.vector_changes.unsubscribe(self._on_change)
        self.drop()
        self._writer.shutdown(wait=False)

    async def _partition(self, key: Key) -> Partition | None:
        with self._lock:
            part = self._parts.get(key)
            if part is not None:
                self._parts.move_to_end(key)
                return part
        if self.budget <= 0 or key in self._too_big:
            return None
        lock = self._loading.setdefault(key, asyncio.Lock())
        try:
            async with lock:
                with self._lock:
                    part = self._parts.get(key)
                if part is not None:
                    return part
                return await self._load(key)
        finally:
            if not lock.locked() and self._loading.get(key) is lock:
                del self._loading[key]  # one lock per load in flight, not per user ever seen

    async def _load(self, key: Key) -> Partition | None:
        gen = self._gen.get(key, 0)
        row_bytes = DIM * 4 + 12  # float32 vector, int64 rowid, float32 norm
        max_rows = int(self.budget / row_bytes / 1.125) - 16
        loaded = await self.store.vectors.partition(key[0], key[1], max(0, max_rows))
        if loaded is None:
            log.info("vectors of %s for %s exceed the index budget; using sqlite-vec", *key)
            self._too_big.add(key)
            return None
        part = await asyncio.to_thread(Partition, *loaded)
        if self._gen.get(key, 0) != gen:
            return None  # a write committed while this loaded: sqlite-vec answers; load again
        with self._lock:
            self._parts[key] = part
            self._fit(keep=key)
            return self._parts.get(key)

    def _fit(self, keep: Key) -> None:
        """Evict least recently used partitions until the budget holds (caller has _lock)."""
        total = sum(p.nbytes for p in self._parts.values())
        for key in list(self._parts):
            if total <= self.budget:
                break
            if key == keep and len(self._parts) > 1:
                continue
            total -= self._parts.pop(key).nbytes
        if total > self.budget:  # `keep` alone outgrew the budget
            self._parts.pop(keep, None)
            self._too_big.add(keep)

    async def _on_change(self, change: VectorChange) -> None:
        # Runs in the writer's task right after its commit, before it yields (see VectorFeed).
        key = (change.table, change.user_id)
        self._gen[key] = self._gen.get(key, 0) + 1
        if change.reload:  # another front wrote it: read it again on its next query
            self._too_big.discard(key)
            self.drop(*key)
            return
        if len(change.deleted):
            self._too_big.discard(key)
        with self._lock:
            part = self._parts.get(key)
        if part is None:
            return
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._writer, self._apply, key, part, change)

    def _apply(self, key: Key, part: Partition, change: VectorChange) -> None:
        try:
            part.apply(change)
        except Exception:  # never leave a stale copy in use
            log.exception("could not apply a vector change; dropping %s for %s", *key)
            with self._lock:
                if self._parts.get(key) is part:
                    del self._parts[key]
            return
        with self._lock:
            if self._parts.get(key) is part:
                self._fit(keep=key)
