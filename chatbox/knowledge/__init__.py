"""Knowledge: embeddings, long-term memory, documents, retrieval and search (sqlite-vec)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from chatbox.engine.types import Engine
from chatbox.knowledge.documents import DocumentService
from chatbox.knowledge.embedder import Embedder, EmbeddingUnavailable
from chatbox.knowledge.errors import (
    ContentRefused,
    EmptyFile,
    EncryptedFile,
    FileTooLarge,
    KnowledgeError,
    NotFoundError,
    NotKept,
    RejectedFile,
    UnsupportedFile,
)
from chatbox.knowledge.extraction import Extractor
from chatbox.knowledge.memory import MemoryService
from chatbox.knowledge.retrieval import Retriever
from chatbox.knowledge.search import SearchHit, SearchService
from chatbox.knowledge.vector_index import VectorIndex
from chatbox.settings import Settings
from chatbox.store import Chunk, Document, Memory, Store

__all__ = [
    "Chunk",
    "ContentRefused",
    "Document",
    "EmbeddingUnavailable",
    "EmptyFile",
    "EncryptedFile",
    "FileTooLarge",
    "Knowledge",
    "KnowledgeError",
    "Memory",
    "NotFoundError",
    "NotKept",
    "RejectedFile",
    "SearchHit",
    "UnsupportedFile",
]


class Knowledge:
    """Every knowledge feature of one app, sharing one embedder."""

    def __init__(
        self, store: Store, settings: Settings, engine: Callable[[], Awaitable[Engine]]
    ) -> None:
        self.store = store
        self.embedder = Embedder(
            settings.embedding_model,
            settings.embedding_device,
            settings.embedding_threads,
            onnx_cache=settings.cache_dir if settings.embedding_runtime == "onnx" else None,
        )
        self.index = VectorIndex(store, settings.knowledge_index_bytes)
        self.memory = MemoryService(store, self.embedder, self.index)
        self.documents = DocumentService(
            store,
            self.embedder,
            settings.max_upload_bytes,
            settings.max_document_chars,
            max_pages=settings.max_pdf_pages,
            max_documents=settings.max_documents_per_user,
            max_user_bytes=settings.max_document_bytes_per_user,
        )
        self.search = SearchService(store, self.embedder, self.index)
        self.extractor = Extractor(store, self.memory, engine, settings.memory_idle_s)
        self.retriever = Retriever(
            store,
            self.embedder,
            self.memory,
            settings.memory_top_k,
            settings.chunk_top_k,
            on_turn=self._turn_done,
            index=self.index,
        )

    def _turn_done(self, user_id: str, conversation_id: str) -> None:
        # Turn vectors for search are made when a search needs them (SearchService.index),
        # so a plain chat never has to load the embedding model.
        self.extractor.touch(user_id, conversation_id)

    async def shutdown(self) -> None:
        await self.extractor.shutdown()
        self.embedder.close()
        self.index.close()
