"""LlamaEngine: one loaded model behind the Engine protocol, and its Generation handle."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from chatbox.engine.chat_template import TRANSCRIPT, TRANSCRIPT_STOPS, ChatTemplate
from chatbox.engine.generation import EngineGeneration
from chatbox.engine.job import Job
from chatbox.engine.kernels import choose, choose_apart
from chatbox.engine.kv.disk import forget_everywhere, forget_scope_everywhere, open_store
from chatbox.engine.kv.prefixes import common_prefix
from chatbox.engine.llama import Context, ContextParams, Model
from chatbox.engine.metrics import EngineMetrics
from chatbox.engine.retokenize import Retokenizer
from chatbox.engine.sampling import check_grammar
from chatbox.engine.scheduler import Scheduler
from chatbox.engine.tuning import (
    ThreadTuner,
    attention,
    available_cores,
    decode_threads,
    idle_cell_budget,
    kv_shape,
    memory_available,
    park_budget,
    parks,
    prefix_cache_warning,
)
from chatbox.engine.turns import turn_separator
from chatbox.engine.types import (
    ChatMessage,
    ContextOverflowError,
    EngineBusyError,
    EngineError,
    EngineEvent,
    EngineStats,
    GenerationRequest,
    ModelInfo,
    TokenEvent,
    ToolSpec,
    answer_room,
)
from chatbox.settings import EngineSettings

MAX_SEQS = 256  # llama.cpp's LLAMA_MAX_SEQ


def _slots(s: EngineSettings) -> int:
    """Sequence ids of the context: the decoding slots and those that only cache prefixes."""
    n_parallel = max(1, s.n_parallel)
    extra = s.n_cached_seqs if s.n_cached_seqs >= 0 else (n_parallel if s.kv_unified else 0)
    return min(n_parallel + extra, MAX_SEQS)


log = logging.getLogger(__name__)


class LlamaEngine:
    """A GGUF model served with continuous batching and a per-conversation prefix cache."""

    def __init__(
        self,
        path: Path,
        name: str,
        settings: EngineSettings,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.model = Model(Path(path), n_gpu_layers=settings.n_gpu_layers)
        bos = self.model.piece(self.model.bos, special=True).decode("utf-8", "replace")
        eos = self.model.piece(self.model.eos, special=True).decode("utf-8", "replace")
        self._bos_text = bos if self.model.bos >= 0 else ""
        self._public: dict[tuple[ChatMessage, ...], list[int]] = {}  # public_prefix probes
        self._prompts: dict[tuple[tuple[ChatMessage, ...], tuple[ToolSpec, ...]], tuple[int, ...]]
        self._prompts = {}
        self._separator: tuple[int, ...] | None = None  # see turn_separator
        self._retok = Retokenizer(
            partial(self.model.tokenize, parse_special=True),
            self.model.special_texts(),
            enabled=self.model.pieces_split_first(),
        )
        source = self.model.chat_template()
        if source is None:  # a base model: a plain transcript (see chat_template.py)
            self.template = ChatTemplate(TRANSCRIPT, self._bos_text, eos, TRANSCRIPT_STOPS)
        else:
            self.template = ChatTemplate(source, self._bos_text, eos)
        train = self.model.n_ctx_train
        self._available = memory_available()
        self._n_slots = _slots(settings)
        self._cells, per_seq = kv_shape(
            settings,
            self._n_slots,
            train,
            self.model.kv_bytes(1, settings.kv_type),
            self._available,
        )
        # the attention kernel as decided for this model on this hardware
        self.settings = attention(settings, self.model.offloaded, self.model.n_head, per_seq)
        # where that left the choice open (plain attention by default on CPU), it is timed
        # at start: which kernel wins depends on the processor (kernels.py)
        open_choice = settings.flash_attn is None and not self.settings.flash_attn
        self._timed = open_choice and settings.kernel_cache is not None
        self._flash = attention(replace(settings, flash_attn=True), False, 1, per_seq)
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
        n_parallel, n_slots = max(1, s.n_parallel), self._n_slots
        cores = available_cores()
        threads, batch_threads = decode_threads(s.n_threads, cores)
        per_seq = self.info.n_ctx_per_seq
        if self._timed:
            self._timed, ubatches = False, (s.n_ubatch, self._flash.n_ubatch)
            kv_type = self.model.fitting_kv_type(s.kv_type)
            timing = partial(choose, self.model, threads, *ubatches, s.kernel_cache, kv_type)
            if await asyncio.to_thread(choose_apart, timing):
                self.settings = s = self._flash
        # a unified pool of n_ctx cells, or a stream of per_seq cells for every sequence id
        n_ctx = self._cells
        warning = prefix_cache_warning(s, n_ctx, per_seq)
        if warning:
            log.warning("%s: %s", self.info.name, warning)
        kernel = "flash" if s.flash_attn else "plain"
        log.info("%s: %s attention, passes of %d tokens", self.info.name, kernel, s.n_ubatch)
        params = ContextParams(
            n_ctx=n_ctx,
            n_seq_max=n_slots,
            n_batch=s.n_batch,
            n_threads=threads,
            n_threads_batch=batch_threads,
            n_ubatch=s.n_ubatch,
            flash_attn=bool(s.flash_attn),
            kv_type=s.kv_type,
            kv_unified=s.kv_unified,
        )
        ctx = await asyncio.to_thread(Context, self.model, params)
        await asyncio.to_thread(ctx.warm_up)
        disk = await asyncio.to_thread(open_store, s, self.model.path, ctx.states)
        kv_bytes = self.model.kv_bytes(n_ctx, s.kv_type)
        park_bytes = park_budget(s.park_bytes, kv_bytes, self._available, disk is not None)
        log.info(
            "%s: KV cache of %d cells (%s; %d a conversation), %d MB; parked KV in RAM up to %d MB",
            self.info.name,
            n_ctx,
            "one pool" if s.kv_unified else f"{n_slots} streams",
            per_seq,
            kv_bytes >> 20,
            park_bytes >> 20,
        )
        # State memory kept free for the next save: what parking may hold, and at least two
        # whole streams' states (a park the disk writer still holds, and a prefix copied
        # between streams), so a save reuses memory instead of faulting fresh memory in on
        # the decode thread (up to 180 ms for 22 MB on a VM).
        stream = self.model.kv_bytes(per_seq, s.kv_type) * 101 // 100 + (1 << 20)
        ctx.states.keep_bytes = min(ctx.states.keep_bytes, max(park_bytes, 2 * stream))
        self._ctx = ctx
        self._scheduler = Scheduler(
            self.model,
            ctx,
            n_parallel=min(n_parallel, n_slots),
            n_slots=n_slots,
            n_ctx_per_seq=self.info.n_ctx_per_seq,
            park_bytes=park_bytes,
            metrics=self.metrics,
            stall_ratio=s.prefill_stall_ratio,
            prefill_chunk=s.prefill_chunk,
            idle_cells=idle_cell_budget(s.idle_kv_cells, n_ctx, per_seq, parks(s), s.kv_unified),
            disk=disk,
            lookup_draft=s.lookup_draft,
            # A configured count is kept; by default the count is measured per kind of step.
            tuner=ThreadTuner(cores, (threads, batch_threads), explore=s.n_threads <= 0),
            stream_interval_s=s.stream_interval_s,
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
    def prompt_tokens(
        self, messages: tuple[ChatMessage, ...], tools: tuple[ToolSpec, ...] = ()
    ) -> list[int]:
        # The API counts a prompt's tokens before submitting it: render and tokenize once.
        hit = self._prompts.get((messages, tools))
        if hit is not None:
            return list(hit)
        text = self.template.render(messages, add_generation_prompt=True, tools=tools)
        add_bos = self.model.add_bos and not (self._bos_text and text.startswith(self._bos_text))
        tokens = self._retok.tokenize(text, add_bos)  # from where an earlier prompt differs
        if len(self._prompts) >= 64:
            self._prompts.clear()
        self._prompts[(messages, tools)] = tuple(tokens)
        return tokens

    def count_tokens(
        self, messages: tuple[ChatMessage, ...], tools: tuple[ToolSpec, ...] = ()
    ) -> int:
        return len(self.prompt_tokens(messages, tools))

    def raw_prompt_tokens(self, text: str) -> list[int]:
        """A raw prompt's tokens: the model's BOS, then the text (special tokens parsed, as
        llama.cpp's server does)."""
        return self._retok.tokenize(text, self.model.add_bos)

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

    def turn_separator(self) -> tuple[int, ...]:
        """The template's tokens between an answer and the next user message (turns.py)."""
        if self._separator is None:
            text_tokens = partial(self.model.tokenize, add_special=False, parse_special=False)
            self._separator = turn_separator(self.prompt_tokens, text_tokens)
        return self._separator

    def submit(
        self, request: GenerationRequest, *, capture_logits: int = 0, ignore_eog: bool = False
    ) -> EngineGeneration:
        """Queue a request (from the event loop); may raise ContextOverflowError/EngineBusyError."""
        sched = self._scheduler
        if sched is None:
            raise EngineError("the model is not loaded")
        if request.prompt is not None:
            prompt = self.raw_prompt_tokens(request.prompt)
        else:
            prompt = self.prompt_tokens(request.messages, request.tools)
        if request.sampling.grammar:  # a bad grammar is the caller's error, not a failed run
            check_grammar(
                self.model.vocab, request.sampling.grammar, request.sampling.grammar_triggers
            )
        if request.continue_text:  # the answer so far, as already-written assistant text
            prompt += self.model.tokenize(
                request.continue_text, add_special=False, parse_special=False
            )
        raw = request.prompt is not None
        extra = [t for t in self.template.stops if t not in request.sampling.stop and not raw]
        if extra:  # a transcript template: the answer ends where the next "User:" line starts
            request = replace(
                request, sampling=replace(request.sampling, stop=(*request.sampling.stop, *extra))
            )
        limit = self.info.n_ctx_per_seq
        room = answer_room(request.sampling.max_tokens)
        if not prompt or len(prompt) + room > limit:
            raise ContextOverflowError(len(prompt), limit)
        if sched.stats.queue_depth >= self.settings.max_queue:
            raise EngineBusyError("the server is busy; try again shortly")
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[EngineEvent] = asyncio.Queue()

        jobs: list[Job] = []

        def gone() -> None:  # the loop is gone: nobody is listening any more
            for j in jobs:
                j.cancelled = True

        def sink_for(index: int) -> Callable[[EngineEvent], None]:
            first = True  # an answer's first token and its end go out at once

            def sink(event: EngineEvent) -> None:
                nonlocal first
                if event.index != index:  # one of n answers: say which
                    event = replace(event, index=index)
                urgent = first or not isinstance(event, TokenEvent)
                first = False
                sched.outbox.post(loop, events.put_nowait, event, gone, urgent)

            return sink

        # A raw prompt has no template around it: all of it is the user's.
        public = (
            0 if raw else self.public_prefix(request.messages[: request.shared_messages], prompt)
        )
        follows = request.cache_key and request.n <= 1 and not request.tools and not raw
        follows = follows and not request.continue_text and not self.template.stops
        separator = self.turn_separator() if follows else ()
        for i in range(max(1, request.n)):
            seed = request.sampling.seed
            jobs.append(
                Job(
                    request=replace(
                        request,
                        sampling=replace(request.sampling, seed=None if seed is None else seed + i),
                    )
                    if i
                    else request,
                    prompt=prompt,
                    sink=sink_for(i),
                    public=public,
                    separator=separator,  # () whenever n > 1
                    capture_logits=0 if i else capture_logits,
                    ignore_eog=ignore_eog,
                    lstrip=bool(self.template.stops) and not request.continue_text and not raw,
                )
            )
        job = jobs[0]
        job.forks = jobs[1:]  # started from a copy of the first one's prefilled KV
        gen = EngineGeneration(self._wake, job, events, jobs)
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

    def memory(self) -> dict[str, Any]:
        """Where this engine's memory goes: its weights file, its KV cache and parked KV."""
        ctx, sched = self._ctx, self._scheduler
        kv = self.model.kv_bytes(ctx.n_ctx, self.settings.kv_type) if ctx is not None else 0
        parked = 0
        if sched is not None:
            parked = sched.slots.parked.size + sched.slots.heads.size
        kept = ctx.states.free_bytes if ctx is not None else 0
        return {
            "path": str(self.model.path),
            "kv_bytes": kv,
            "parked_bytes": parked,
            "state_free_bytes": kept,
        }

    async def kv_report(self) -> dict[int, tuple[int, int]]:
        """seq -> (cached tokens per the slot table, per llama.cpp); they must agree."""
        if self._scheduler is None:
            return {}
        sched = self._scheduler
        return await asyncio.wrap_future(sched.call(lambda: _kv_report(sched)))

    async def clear_cache(self) -> int:
        """Forget all idle cached prefixes (e.g. to measure a cold start)."""
        if self._scheduler is None:
            return 0
        return int(await asyncio.wrap_future(self._scheduler.call(self._scheduler.clear_cache)))

    async def forget(self, cache_key: str) -> None:
        """A conversation was deleted: drop its KV everywhere (cache, RAM, disk); returns
        once its parked file is gone."""
        sched = self._scheduler
        if sched is None:
            return
        done = await asyncio.wrap_future(sched.call(lambda: sched.forget(cache_key)))
        if done is not None:
            await asyncio.to_thread(done.wait)
        if self.settings.kv_dir is not None:  # other models' files (of the same conversation)
            await asyncio.to_thread(forget_everywhere, self.settings.kv_dir, cache_key)

    async def forget_scope(self, scope: str) -> None:
        """An account was erased: drop every KV of its scope (its stateless completions'
        too, whose keys nobody else knows) from the cache, RAM and disk."""
        sched = self._scheduler
        if sched is None:
            return
        done = await asyncio.wrap_future(sched.call(lambda: sched.forget_scope(scope)))
        if done is not None:
            await asyncio.to_thread(done.wait)
        if self.settings.kv_dir is not None:  # other models' files
            await asyncio.to_thread(forget_scope_everywhere, self.settings.kv_dir, scope)

    async def retune(self) -> None:
        """Start the thread tuner's measurements afresh (start-up work has ended)."""
        sched = self._scheduler
        if sched is not None and sched.tuner is not None:
            tuner = sched.tuner
            await asyncio.wrap_future(sched.call(tuner.reset))

    async def debug_call(self, fn: Any) -> Any:
        """Run fn(scheduler) on the decode thread (tests only)."""
        assert self._scheduler is not None
        sched = self._scheduler
        return await asyncio.wrap_future(sched.call(lambda: fn(sched)))


def _kv_report(sched: Scheduler) -> dict[int, tuple[int, int]]:
    """seq -> (tokens the slot table believes are cached, llama.cpp's pos_max + 1)."""
    return {s.seq: (len(s.tokens), sched.ctx.seq_pos_max(s.seq) + 1) for s in sched.slots.slots}
