"""Retrieval for a turn: the user's relevant memory facts and the best document passages
(vector similarity fused with FTS5 keyword matches), placed within a token budget."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from chatbox.knowledge.embedder import Embedder
from chatbox.knowledge.errors import ContentRefused, NotKept
from chatbox.knowledge.memory import MemoryService, explicit_fact, forget_request
from chatbox.knowledge.types import Citation, CountText, TurnContext
from chatbox.knowledge.vector_index import VectorIndex
from chatbox.store import Chunk, Store
from chatbox.store.documents import library_owner

log = logging.getLogger("chatbox.knowledge")
RRF_K = 60  # reciprocal-rank fusion constant
CHUNK_MIN_SIM = 0.15  # a passage this unlike the question is left out unless its words match
PASSAGE_CHARS = 240  # excerpt shown with a citation
_WORD = re.compile(r"\w+", re.UNICODE)
_FTS_STOP_WORDS = """the a an and or of to in on at for with is are was were be what which
who how why when where do does did it this that i you my your me can could would should please
tell about from"""
_FTS_STOP = frozenset(_FTS_STOP_WORDS.split())


def fts_any(text: str, limit: int = 12) -> str | None:
    """An FTS5 query matching any of the text's words (each quoted, so input is never syntax)."""
    words = [w.lower() for w in _WORD.findall(text) if len(w) > 2]
    words = [w for w in dict.fromkeys(words) if w not in _FTS_STOP][:limit]
    return " OR ".join(f'"{w}"' for w in words) if words else None


def fts_all(text: str, limit: int = 12) -> str | None:
    """An FTS5 query matching all of the text's words, the last as a prefix (search as you type)."""
    words = list(dict.fromkeys(w.lower() for w in _WORD.findall(text)))[:limit]
    if not words:
        return None
    *head, last = words
    return " ".join([*(f'"{w}"' for w in head), f'"{last}"*'])


def _excerpt(text: str, chars: int = PASSAGE_CHARS) -> str:
    return text if len(text) <= chars else text[: chars - 1].rstrip() + "…"


class Retriever:
    """The chat layer's ContextProvider: retrieval before a turn, follow-up after it."""

    def __init__(
        self,
        store: Store,
        embedder: Embedder,
        memory: MemoryService,
        memory_k: int,
        chunk_k: int,
        on_turn: Callable[[str, str], None] | None = None,
        index: VectorIndex | None = None,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.memory = memory
        self.memory_k = memory_k
        self.chunk_k = chunk_k
        self.on_turn = on_turn  # (user_id, conversation_id): schedule extraction, indexing
        self.vectors = index

    async def for_turn(
        self,
        user_id: str,
        conversation_id: str,
        query: str,
        budget_tokens: int,
        count: CountText,
        workspace_id: str | None = None,
    ) -> TurnContext:
        """A workspace conversation draws on its workspace's library only: never on the
        memory or documents of whichever member happens to be asking."""
        remembered: tuple[str, ...] = ()
        try:
            if workspace_id is None and await self.memory.enabled(user_id):
                remembered = await self._explicit(user_id, conversation_id, query)
            context = await self._for_turn(
                user_id, conversation_id, query, budget_tokens, count, workspace_id
            )
            return replace(context, remembered=remembered)
        except Exception:  # retrieval is an aid: a failure there must not fail the turn
            log.exception("retrieval failed; answering without it")
            return TurnContext(remembered=remembered)

    async def _for_turn(
        self,
        user_id: str,
        conversation_id: str,
        query: str,
        budget: int,
        count: CountText,
        workspace_id: str | None = None,
    ) -> TurnContext:
        use_memory = workspace_id is None and await self.memory.enabled(user_id)
        owner = library_owner(workspace_id, user_id)  # whose documents: the user's or the team's
        has_docs = await self.store.documents.has_any(owner, conversation_id)
        use_memory = use_memory and await self.store.memories.count(user_id) > 0
        if not use_memory and not has_docs:
            return TurnContext()  # nothing to retrieve: the embedding model is not needed
        vector = await self.embedder.embed_one(query)
        facts = await self.memory.relevant(user_id, vector, self.memory_k) if use_memory else []
        chunks = await self._chunks(owner, conversation_id, query, vector) if has_docs else []

        sections: list[str] = []
        memory_ids: list[str] = []
        if facts:
            sections.append("What you know about the user (from earlier conversations):")
            for memory, _ in facts:
                line = f"- {memory.text}"
                if count("\n".join([*sections, line])) > budget:
                    break
                sections.append(line)
                memory_ids.append(memory.id)
            if not memory_ids:
                sections.clear()
        citations: list[Citation] = []
        if chunks:
            head = (
                "Passages from the user's documents. Use them when they help, and cite "
                "them as [1], [2]:"
            )
            for chunk, score in chunks:
                n = len(citations) + 1
                where = f"{chunk.document_name}" + (f", page {chunk.page}" if chunk.page else "")
                block = f"[{n}] ({where})\n{chunk.text}"
                trial = [*sections, *([head] if not citations else []), block]
                if count("\n\n".join(trial)) > budget:
                    break
                sections = trial
                citations.append(
                    Citation(
                        n,
                        chunk.seq,
                        chunk.document_id,
                        chunk.document_name,
                        chunk.page,
                        score,
                        _excerpt(chunk.text),
                    )
                )
        if not memory_ids and not citations:
            return TurnContext()
        text = "\n\n".join(sections) if citations else "\n".join(sections)
        return TurnContext(text, tuple(citations), tuple(memory_ids), count(text))

    async def _explicit(self, user_id: str, conversation_id: str, message: str) -> tuple[str, ...]:
        """'Remember that …' is stored at once (the facts as saved are returned); 'forget …'
        removes the closest facts."""
        fact = explicit_fact(message)
        if fact is not None:
            # moderation (not kept, and recorded) or zero-data-retention (not kept)
            with contextlib.suppress(ContentRefused, NotKept):
                changes = await self.memory.add(user_id, [fact], "explicit", conversation_id)
                return tuple(c.memory.text for c in changes)
            return ()
        forget = forget_request(message)
        if forget is not None:
            await self.memory.forget(user_id, forget)
        return ()

    async def _chunks(
        self, user_id: str, conversation_id: str, query: str, vector: np.ndarray
    ) -> list[tuple[Chunk, float]]:
        """Top passages: vector hits and keyword hits fused by reciprocal rank."""
        k = self.chunk_k
        by_vec = await self.nearest_chunks(user_id, conversation_id, vector, k * 2)
        match = fts_any(query)
        by_kw = (
            await self.store.documents.keyword_chunks(user_id, conversation_id, match, k * 2)
            if match
            else []
        )
        scores: dict[int, float] = {}
        chunks: dict[int, Chunk] = {}
        sims: dict[int, float] = {}
        for rank, (chunk, dist) in enumerate(by_vec):
            sim = 1.0 - dist * dist / 2.0
            sims[chunk.seq] = sim
            if sim >= CHUNK_MIN_SIM:
                chunks[chunk.seq] = chunk
                scores[chunk.seq] = scores.get(chunk.seq, 0.0) + 1.0 / (RRF_K + rank)
        for rank, (chunk, _) in enumerate(by_kw):
            chunks[chunk.seq] = chunk
            scores[chunk.seq] = scores.get(chunk.seq, 0.0) + 1.0 / (RRF_K + rank)
        best = sorted(scores, key=lambda s: -scores[s])[:k]
        return [(chunks[s], sims.get(s, 0.0)) for s in best]

    async def library(
        self, user_id: str, conversation_id: str | None, query: str, workspace_id: str | None
    ) -> list[tuple[Chunk, float]]:
        """The best passages for `query` in the user's library (with the conversation's
        attachments), or a workspace conversation's workspace library."""
        owner = library_owner(workspace_id, user_id)
        if not await self.store.documents.has_any(owner, conversation_id or ""):
            return []
        vector = await self.embedder.embed_one(query)
        found = await self._chunks(owner, conversation_id or "", query, vector)
        if found:
            return found
        # Asked to search, the nearest passages are the answer even when none is close.
        near = await self.nearest_chunks(owner, conversation_id or "", vector, self.chunk_k)
        return [(chunk, 1.0 - dist * dist / 2.0) for chunk, dist in near]

    async def recall(self, user_id: str, query: str, k: int) -> list[str]:
        """The user's remembered facts most like `query` (none when memory is off)."""
        if not await self.memory.enabled(user_id) or await self.store.memories.count(user_id) == 0:
            return []
        vector = await self.embedder.embed_one(query)
        return [m.text for m, _ in await self.memory.relevant(user_id, vector, k)]

    async def nearest_chunks(
        self, user_id: str, conversation_id: str, vector: np.ndarray, k: int
    ) -> list[tuple[Chunk, float]]:
        """The k chunks in scope nearest to vector (L2), from the in-RAM index when it holds
        the user's chunks, else sqlite-vec; both over-fetch 4x, then keep those in scope."""
        hits = (
            await self.vectors.nearest("chunk_vec", user_id, vector, k * 4)
            if self.vectors
            else None
        )
        if hits is None:
            return await self.store.documents.nearest_chunks(user_id, conversation_id, vector, k)
        rows = await self.store.documents.chunks_in_scope(
            user_id, conversation_id, [seq for seq, _ in hits]
        )
        return [(rows[seq], d) for seq, d in hits if seq in rows][:k]

    async def turn_finished(
        self, user_id: str, conversation_id: str, turn_id: str, context: TurnContext
    ) -> None:
        try:
            if context.citations:
                await self.store.documents.cite(
                    turn_id, [(c.chunk_id, c.score) for c in context.citations]
                )
            if self.on_turn is not None and user_id:  # "": a workspace's (no one's memory)
                self.on_turn(user_id, conversation_id)
        except Exception:
            log.exception("could not record what turn %s drew on", turn_id)
