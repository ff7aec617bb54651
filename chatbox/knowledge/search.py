"""Search across the conversations a user may see (the store's `visible_to`): by words
(FTS5) in all of them, and by meaning (turn vectors) in those they started."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, replace

import numpy as np

from chatbox.cpu import URGENT
from chatbox.knowledge.embedder import Embedder
from chatbox.knowledge.retrieval import fts_all, fts_any
from chatbox.knowledge.vector_index import VectorIndex
from chatbox.store import Store, TurnHit
from chatbox.store.search import HIT_END as HIT_END  # re-exported for the web layer
from chatbox.store.search import HIT_START as HIT_START

INDEX_BATCH = 128
INDEX_HOLD_S = 600.0  # a claim on a user's indexing, should its front die mid-way
# Turns written since the user's last indexing (an answer or a few) are matched by their words
# while they are embedded behind the search; a longer backlog only by the FTS search.
FRESH_TURNS = 32
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

    def _index_behind(self, user_id: str) -> None:
        """Embed the user's turns not yet indexed after this search, in the background lane
        (which gives way to the urgent one); one indexer per user at a time."""
        lock = self._indexing.setdefault(user_id, asyncio.Lock())
        if not lock.locked():
            task = asyncio.create_task(self._index_locked(user_id, lock))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _index_locked(self, user_id: str, lock: asyncio.Lock) -> int:
        async with lock:
            job = f"index:{user_id}"
            if not await self.store.jobs.claim(job, INDEX_HOLD_S):
                return 0  # another front is indexing this user's turns now
            try:
                return await self.index(user_id)
            finally:
                await self.store.jobs.done(job)

    async def _fresh(self, user_id: str, query: str) -> list[SearchHit]:
        """The user's turns not yet in the vector index that hold a query word, as word hits
        scored by the share of the query's words they hold; they are indexed behind.

        A search embeds nothing but its query before it answers: the turns written since the
        last search (an answer's, 70-200 ms to embed on a busy box) stand in by their words.
        """
        pending = await self.store.search.unindexed(user_id, FRESH_TURNS)
        if not pending:
            return []
        self._index_behind(user_id)
        words = {w for w in re.findall(r"\w+", query.lower()) if len(w) > 2}
        share: dict[int, float] = {}
        for seq, text in pending:
            held = {w for w in words if re.search(rf"\b{re.escape(w)}", text, re.IGNORECASE)}
            if held:
                share[seq] = len(held) / len(words)
        if not share:
            return []
        found = await self.store.search.turns_by_seq(user_id, list(share))
        return [
            self._hit(hit, mark_words(text, query), "words", share[seq])
            for seq, text in pending
            if seq in share and (hit := found.get(seq)) is not None
        ]

    async def search(
        self, user_id: str, query: str, mode: str = "both", limit: int = 20
    ) -> list[SearchHit]:
        """Hits in the live conversations the user may see, best first; mode: words, meaning
        or both (by meaning, the user's turns not yet indexed are matched by their words)."""
        query = query.strip()
        if not query:
            return []
        # The engines leave a person's search a core: its reads' trips between the event loop
        # and the database thread otherwise each wait behind spinning decode workers.
        with URGENT.hold():
            # Both ways at once: their trips to the database thread overlap each other's and
            # the query's encode, which on a busy box is most of a search's time.
            words, (fresh, near) = await asyncio.gather(
                self._words(user_id, query, mode, limit),
                self._meaning(user_id, query, limit) if mode != "words" else _nothing(),
            )
        hits: dict[str, SearchHit] = {}
        for rank, hit in enumerate(words):
            hits[hit.turn_id] = self._hit(hit, hit.snippet, "words", 1.0 / (1 + rank))
        for fresh_hit in fresh:  # not searchable by meaning yet
            prior = hits.get(fresh_hit.turn_id)
            if prior is None or prior.score < fresh_hit.score:
                hits[fresh_hit.turn_id] = fresh_hit
        for hit in near:
            sim = 1.0 - hit.score * hit.score / 2.0
            if sim < SEMANTIC_MIN_SIM:
                continue
            prior = hits.get(hit.turn_id)
            if prior is not None:
                hits[hit.turn_id] = SearchHit(
                    **{**prior.__dict__, "match": "both", "score": prior.score + sim}
                )
            else:
                hits[hit.turn_id] = self._hit(hit, mark_words(hit.snippet, query), "meaning", sim)
        return sorted(hits.values(), key=lambda h: -h.score)[:limit]

    async def _words(self, user_id: str, query: str, mode: str, limit: int) -> list[TurnHit]:
        """FTS hits for every query word, or (searching both ways) for any when none has all."""
        if mode not in ("words", "both"):
            return []
        match = fts_all(query)
        found = await self.store.search.keyword(user_id, match, limit) if match else []
        if not found and mode == "both":
            match = fts_any(query)
            found = await self.store.search.keyword(user_id, match, limit) if match else []
        return found

    async def _meaning(
        self, user_id: str, query: str, limit: int
    ) -> tuple[list[SearchHit], list[TurnHit]]:
        """The fresh turns' word hits, and the indexed turns nearest the query's vector."""
        vector, fresh = await asyncio.gather(
            self.embedder.embed_one(query), self._fresh(user_id, query)
        )
        return fresh, await self.semantic(user_id, vector, limit)

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


async def _nothing() -> tuple[list[SearchHit], list[TurnHit]]:
    return [], []
