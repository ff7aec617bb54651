"""Search across the conversations a user may see (the store's `visible_to`): by words
(FTS5) in all of them, and by meaning (turn vectors) in those they started."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, replace

import numpy as np

from chatbox.knowledge.embedder import Embedder
from chatbox.knowledge.retrieval import fts_all, fts_any
from chatbox.knowledge.vector_index import VectorIndex
from chatbox.store import Store, TurnHit
from chatbox.store.search import HIT_END as HIT_END  # re-exported for the web layer
from chatbox.store.search import HIT_START as HIT_START

INDEX_BATCH = 128
INDEX_HOLD_S = 600.0  # a claim on a user's indexing, should its front die mid-way
# Turns written since the user's last search (an answer or a few) are embedded with the query.
URGENT_TURNS = 8
SEMANTIC_MIN_SIM = 0.3
SNIPPET_CHARS = 200


@dataclass(frozen=True)
class SearchHit:
    turn_id: str
    conversation_id: str
    title: str | None
    role: str
    snippet: str  # matched words between HIT_START and HIT_END
    match: str  # words | meaning | both
    score: float  # higher is better
    created_at: float


def mark_words(text: str, query: str, chars: int = SNIPPET_CHARS) -> str:
    """A snippet of text around the first query word, each query word marked."""
    words = [re.escape(w) for w in re.findall(r"\w+", query.lower()) if len(w) > 2]
    flat = " ".join(text.split())
    if not words:
        return flat[:chars]
    pattern = re.compile(r"\b(" + "|".join(words) + r")\w*", re.IGNORECASE)
    first = pattern.search(flat)
    start = max(0, (first.start() if first else 0) - chars // 3)
    piece = flat[start : start + chars]
    piece = ("…" if start else "") + piece + ("…" if start + chars < len(flat) else "")
    return pattern.sub(lambda m: f"{HIT_START}{m.group(0)}{HIT_END}", piece)


class SearchService:
    def __init__(self, store: Store, embedder: Embedder, index: VectorIndex | None = None) -> None:
        self.store = store
        self.embedder = embedder
        self.vectors = index
        self._indexing: dict[str, asyncio.Lock] = {}  # one indexer per user at a time
        self._tasks: set[asyncio.Task[int]] = set()

    async def semantic(self, user_id: str, vector: np.ndarray, limit: int) -> list[TurnHit]:
        """The user's indexed turns nearest in meaning (score: L2 distance), nearest first."""
        hits = (
            await self.vectors.nearest("turn_vec", user_id, vector, limit * 2)
            if self.vectors
            else None
        )
        if hits is None:
            return await self.store.search.semantic(user_id, vector, limit)
        rows = await self.store.search.turns_by_seq(user_id, [seq for seq, _ in hits])
        return [replace(rows[seq], score=d) for seq, d in hits if seq in rows][:limit]

    async def index(self, user_id: str, max_turns: int = 2048) -> int:
        """Embed the user's turns not yet in the vector index; returns how many were added."""
        done = 0
        while done < max_turns:
            pending = await self.store.search.unindexed(user_id, INDEX_BATCH)
            if not pending:
                break
            vectors = await self.embedder.embed([text[:2000] or " " for _, text in pending])
            items = [(seq, v) for (seq, _), v in zip(pending, vectors, strict=True)]
            await self.store.search.add_vectors(user_id, items, pending[-1][0])
            done += len(pending)
        return done

    async def _query_vector(self, user_id: str, query: str) -> np.ndarray:
        """The query's vector, with the user's turns not yet indexed caught up first.

        A search never waits on the background lane, which streaming answers' moderation
        keeps busy: a few new turns are embedded in the query's own urgent batch, a longer
        backlog (a first search) is indexed in the background while this search uses what is
        indexed already (its words search sees every turn).
        """
        lock = self._indexing.setdefault(user_id, asyncio.Lock())
        if lock.locked():  # a backlog is being indexed
            return await self.embedder.embed_one(query)
        async with lock:
            pending = await self.store.search.unindexed(user_id, URGENT_TURNS + 1)
            if len(pending) > URGENT_TURNS:
                task = asyncio.create_task(self._index_locked(user_id, lock))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                pending = []
            if not pending:
                return await self.embedder.embed_one(query)
            texts = [query, *(text[:2000] or " " for _, text in pending)]
            vectors = await self.embedder.embed(texts, urgent=True)
            items = [(seq, v) for (seq, _), v in zip(pending, vectors[1:], strict=True)]
            await self.store.search.add_vectors(user_id, items, pending[-1][0])
            query_vector: np.ndarray = vectors[0]
            return query_vector

    async def _index_locked(self, user_id: str, lock: asyncio.Lock) -> int:
        async with lock:
            job = f"index:{user_id}"
            if not await self.store.jobs.claim(job, INDEX_HOLD_S):
                return 0  # another front is indexing this user's turns now
            try:
                return await self.index(user_id)
            finally:
                await self.store.jobs.done(job)

    async def search(
        self, user_id: str, query: str, mode: str = "both", limit: int = 20
    ) -> list[SearchHit]:
        """Hits in the live conversations the user may see, best first; mode: words, meaning
        or both."""
        query = query.strip()
        if not query:
            return []
        hits: dict[str, SearchHit] = {}
        if mode in ("words", "both"):
            match = fts_all(query)
            found = await self.store.search.keyword(user_id, match, limit) if match else []
            if not found and mode == "both":
                match = fts_any(query)
                found = await self.store.search.keyword(user_id, match, limit) if match else []
            for rank, hit in enumerate(found):
                hits[hit.turn_id] = self._hit(hit, hit.snippet, "words", 1.0 / (1 + rank))
        if mode in ("meaning", "both"):
            vector = await self._query_vector(user_id, query)
            for hit in await self.semantic(user_id, vector, limit):
                sim = 1.0 - hit.score * hit.score / 2.0
                if sim < SEMANTIC_MIN_SIM:
                    continue
                prior = hits.get(hit.turn_id)
                if prior is not None:
                    hits[hit.turn_id] = SearchHit(
                        **{**prior.__dict__, "match": "both", "score": prior.score + sim}
                    )
                else:
                    hits[hit.turn_id] = self._hit(
                        hit, mark_words(hit.snippet, query), "meaning", sim
                    )
        return sorted(hits.values(), key=lambda h: -h.score)[:limit]

    @staticmethod
    def _hit(hit: TurnHit, snippet: str, match: str, score: float) -> SearchHit:
        return SearchHit(
            hit.turn_id,
            hit.conversation_id,
            hit.title,
            hit.role,
            snippet,
            match,
            score,
            hit.created_at,
        )
