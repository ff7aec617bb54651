"""Knowledge: embeddings, long-term memory, documents, retrieval and search (sqlite-vec)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from chatbox.engine.types import Engine
from chatbox.knowledge.documents import DocumentService
from chatbox.knowledge.embedder import Embedder, EmbeddingUnavailable
from chatbox.knowledge.errors import (
    EmptyFile,
    EncryptedFile,
    FileTooLarge,
    KnowledgeError,
    NotFoundError,
    RejectedFile,
    UnsupportedFile,
)
from chatbox.knowledge.extraction import Extractor
from chatbox.knowledge.memory import MemoryService
from chatbox.knowledge.retrieval import Retriever
from chatbox.knowledge.search import SearchHit, SearchService
from chatbox.knowledge.vector_index import VectorIndex
from chatbox.settings import Settings
from chatbox.store import Store

__all__ = [
    "EmbeddingUnavailable", "EmptyFile", "EncryptedFile", "FileTooLarge", "Knowledge",
    "KnowledgeError", "NotFoundError", "RejectedFile", "SearchHit", "UnsupportedFile",
]
log = logging.getLogger("chatbox.knowledge")


class Knowledge:
    """Every knowledge feature of one app, sharing one embedder."""

    def __init__(self, store: Store, settings: Settings,
                 engine: Callable[[], Awaitable[Engine]]) -> None:
        self.store = store
        self.embedder = Embedder(settings.embedding_model, settings.embedding_device)
        self.index = VectorIndex(store, settings.knowledge_index_bytes)
        self.memory = MemoryService(store, self.embedder, self.index)
        self.documents = DocumentService(store, self.embedder, settings.max_upload_bytes,
                                         settings.max_document_chars)
        self.search = SearchService(store, self.embedder, self.index)
        self.extractor = Extractor(store, self.memory, engine, settings.memory_idle_s)
        self.retriever = Retriever(store, self.embedder, self.memory, settings.memory_top_k,
                                   settings.chunk_top_k, on_turn=self._turn_done,
                                   index=self.index)
        self._tasks: set[asyncio.Task[object]] = set()
        self._indexing: set[str] = set()

    def start(self) -> None:
        """Load the embedding model now, in the background (else it loads on first use)."""
        self._spawn(self._load())

    async def _load(self) -> None:
        try:
            await self.embedder.load()
        except Exception:
            log.exception("the embedding model did not load; knowledge features will fail")

    def _turn_done(self, user_id: str, conversation_id: str) -> None:
        # Turn vectors for search are made when a search needs them (SearchService.index),
        # so a plain chat never has to load the embedding model.
        self.extractor.touch(user_id, conversation_id)

    def index_soon(self, user_id: str) -> None:
        """Embed the user's new turns for search in the background."""
        if user_id not in self._indexing:
            self._indexing.add(user_id)
            self._spawn(self._index(user_id))

    async def _index(self, user_id: str) -> None:
        try:
            await self.search.index(user_id)
        except Exception:
            log.exception("search indexing failed for %s", user_id)
        finally:
            self._indexing.discard(user_id)

    def _spawn(self, coro: Awaitable[object]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def shutdown(self) -> None:
        await self.extractor.shutdown()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        self.embedder.close()
        self.index.close()
