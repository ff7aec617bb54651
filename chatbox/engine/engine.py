"""LlamaEngine: one loaded model behind the Engine protocol, and its Generation handle."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from chatbox.engine.chat_template import TRANSCRIPT, TRANSCRIPT_STOPS, ChatTemplate
from chatbox.engine.llama import Context, ContextParams, Model
from chatbox.engine.metrics import EngineMetrics
from chatbox.engine.scheduler import Job, Scheduler
from chatbox.engine.slots import common_prefix
from chatbox.engine.types import (
    ChatMessage,
    ContextOverflowError,
    DoneEvent,
    EngineBusyError,
    EngineError,
    EngineEvent,
    EngineStats,
    GenerationRequest,
    ModelInfo,
)
from chatbox.settings import EngineSettings

MAX_SEQS = 256  # llama.cpp's LLAMA_MAX_SEQ


def decode_threads(configured: int, cores: int) -> tuple[int, int]:
    """llama.cpp threads for one-token steps and for batches of several tokens.

    A configured count is used for both. By default batches use every core, but a lone
    stream's one-token steps leave one core to this process's Python side (the decode
    thread's sampling and the event loop): llama.cpp's worker threads spin between steps,
    so on a small machine a spinning worker and the event loop fight for the same core
    (measured on 2 cores: one stream 136 tokens/s with one thread, 79 with two).
    """
    if configured > 0:
        return configured, configured
    return max(1, cores - 1), cores


class EngineGeneration:
    """A running request: `async for event in gen`; `gen.cancel()` stops it next step.

    Abandoning the iteration (break, aclose, garbage collection) cancels too.
    """

    def __init__(self, engine: LlamaEngine, job: Job, events: asyncio.Queue[EngineEvent]) -> None:
        self._engine = engine
        self._job = job
        self._events = events
        self._finished = False
        self.prompt_tokens = len(job.prompt)

    @property
    def first_logits(self) -> list[np.ndarray]:
        """Logits of the first sampled positions (only with submit(..., capture_logits=N))."""
        return self._job.logits

    def __aiter__(self) -> AsyncIterator[EngineEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[EngineEvent]:
        try:
            while not self._finished:
                event = await self._events.get()
                if isinstance(event, DoneEvent):
                    self._finished = True
                yield event
        finally:
            if not self._finished:
                self.cancel()

    def cancel(self) -> None:
        if not self._job.done and not self._job.cancelled:
            self._job.cancelled = True
            self._engine._wake()

    def __del__(self) -> None:
        try:
            if not self._finished:
                self.cancel()
        except Exception:
            pass


class LlamaEngine:
    """A GGUF model served with continuous batching and a per-conversation prefix cache."""

    def __init__(
        self,
        path: Path,
        name: str,
        settings: EngineSettings,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.settings = settings
        self.model = Model(Path(path), n_gpu_layers=settings.n_gpu_layers)
        bos = self.model.piece(self.model.bos, special=True).decode("utf-8", "replace")
        eos = self.model.piece(self.model.eos, special=True).decode("utf-8", "replace")
        self._bos_text = bos if self.model.bos >= 0 else ""
        self._public: dict[tuple[ChatMessage, ...], list[int]] = {}  # public_prefix probes
        source = self.model.chat_template()
        if source is None:  # a base model: a plain transcript (see chat_template.py)
            self.template = ChatTemplate(TRANSCRIPT, self._bos_text, eos, TRANSCRIPT_STOPS)
        else:
            self.template = ChatTemplate(source, self._bos_text, eos)
        train = self.model.n_ctx_train
        per_seq = min(settings.n_ctx_per_seq, settings.n_ctx)
        if train > 0:
            per_seq = min(per_seq, train)
        self.info = ModelInfo(
            name=name,
            path=str(path),
            n_ctx_per_seq=per_seq,
            n_ctx_train=train,
            architecture=self.model.architecture,
        )
        self.metrics = EngineMetrics(name, registry)
        self._ctx: Context | None = None
        self._scheduler: Scheduler | None = None

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        if self._scheduler is not None:
            return
        s = self.settings
        n_parallel = max(1, s.n_parallel)
        extra = s.n_cached_seqs if s.n_cached_seqs >= 0 else n_parallel
        n_slots = min(n_parallel + extra, MAX_SEQS)
        threads, batch_threads = decode_threads(s.n_threads, os.cpu_count() or 1)
        params = ContextParams(
            n_ctx=max(s.n_ctx, self.info.n_ctx_per_seq),
            n_seq_max=n_slots,
            n_batch=s.n_batch,
            n_threads=threads,
            n_threads_batch=batch_threads,
            flash_attn=s.flash_attn,
            kv_type=s.kv_type,
        )
        ctx = await asyncio.to_thread(Context, self.model, params)
        await asyncio.to_thread(ctx.warm_up)
        self._ctx = ctx
        self._scheduler = Scheduler(
            self.model,
            ctx,
            n_parallel=min(n_parallel, n_slots),
            n_slots=n_slots,
            n_ctx_per_seq=self.info.n_ctx_per_seq,
            park_bytes=s.park_bytes,
            metrics=self.metrics,
            stall_ratio=s.prefill_stall_ratio,
            prefill_chunk=s.prefill_chunk,
            max_idle_cells=s.idle_kv_cells if s.idle_kv_cells >= 0 else None,
        )
        self._scheduler.start()

    async def stop(self) -> None:
        sched, self._scheduler = self._scheduler, None
        if sched is not None:
            await asyncio.to_thread(sched.stop)
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None
        self.metrics.remove()

    def close(self) -> None:
        """Free the weights (after stop())."""
        self.model.close()

    # -- requests ------------------------------------------------------------------------
    def prompt_tokens(self, messages: tuple[ChatMessage, ...]) -> list[int]:
        text = self.template.render(messages, add_generation_prompt=True)
        add_bos = self.model.add_bos and not (self._bos_text and text.startswith(self._bos_text))
        return self.model.tokenize(text, add_special=add_bos, parse_special=True)

    def count_tokens(self, messages: tuple[ChatMessage, ...]) -> int:
        return len(self.prompt_tokens(messages))

    def public_prefix(self, shared: tuple[ChatMessage, ...], prompt: list[int]) -> int:
        """Prompt tokens that do not depend on what a user typed: the template around the
        configured messages `shared`, up to where the first typed message would start.

        Rendering the shared messages followed by two different probe messages and taking
        their common prefix finds that point for any chat template.
        """
        probe = self._public.get(shared)
        if probe is None:
            a = self.prompt_tokens((*shared, ChatMessage("user", "A")))
            b = self.prompt_tokens((*shared, ChatMessage("user", "B")))
            probe = a[: common_prefix(a, b)]
            if len(self._public) > 256:
                self._public.clear()
            self._public[shared] = probe
        return common_prefix(probe, prompt)

    def submit(
        self, request: GenerationRequest, *, capture_logits: int = 0, ignore_eog: bool = False
    ) -> EngineGeneration:
        """Queue a request (from the event loop); may raise ContextOverflowError/EngineBusyError."""
        sched = self._scheduler
        if sched is None:
            raise EngineError("the model is not loaded")
        prompt = self.prompt_tokens(request.messages)
        extra = [t for t in self.template.stops if t not in request.sampling.stop]
        if extra:  # a transcript template: the answer ends where the next "User:" line starts
            request = replace(
                request, sampling=replace(request.sampling, stop=(*request.sampling.stop, *extra))
            )
        limit = self.info.n_ctx_per_seq
        room = min(max(request.sampling.max_tokens, 1), 16)
        if not prompt or len(prompt) + room > limit:
            raise ContextOverflowError(len(prompt), limit)
        if sched.stats.queue_depth >= self.settings.max_queue:
            raise EngineBusyError("the server is busy; try again shortly")
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[EngineEvent] = asyncio.Queue()

        def sink(event: EngineEvent) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:  # the loop is gone: nobody is listening any more
                job.cancelled = True

        job = Job(
            request=request,
            prompt=prompt,
            sink=sink,
            public=self.public_prefix(request.messages[: request.shared_messages], prompt),
            capture_logits=capture_logits,
            ignore_eog=ignore_eog,
            lstrip=bool(self.template.stops),
        )
        gen = EngineGeneration(self, job, events)
        sched.enqueue(job)
        return gen

    def _wake(self) -> None:
        if self._scheduler is not None:
            self._scheduler.wake()

    # -- observability -------------------------------------------------------------------
    def stats(self) -> EngineStats:
        if self._scheduler is None:
            return EngineStats(slots_total=self.settings.n_parallel)
        return self._scheduler.stats

    async def kv_report(self) -> dict[int, tuple[int, int]]:
        """seq -> (cached tokens per the slot table, per llama.cpp); they must agree."""
        if self._scheduler is None:
            return {}
        return await asyncio.wrap_future(self._scheduler.call(self._scheduler.kv_report))

    async def clear_cache(self) -> int:
        """Forget all idle cached prefixes (e.g. to measure a cold start)."""
        if self._scheduler is None:
            return 0
        return int(await asyncio.wrap_future(self._scheduler.call(self._scheduler.clear_cache)))

    async def debug_call(self, fn: Any) -> Any:
        """Run fn(scheduler) on the decode thread (tests only)."""
        assert self._scheduler is not None
        sched = self._scheduler
        return await asyncio.wrap_future(sched.call(lambda: fn(sched)))
