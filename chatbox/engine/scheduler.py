"""The decode thread: continuous batching over one llama.cpp context.

Each step admits waiting jobs into free slots, builds one batch holding the next token of
every decoding sequence plus prefill chunks of new prompts (under a token budget that keeps
running streams responsive), decodes, samples, and emits text. The thread is the only one
that touches the context; other threads talk to it through `inbox` and the jobs' flags.
"""

from __future__ import annotations

import heapq
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chatbox.engine.detok import StopTextStream
from chatbox.engine.kvdisk import DiskStore
from chatbox.engine.llama import DECODE_NO_KV_SPACE, DECODE_OK, Batch, Context, Model
from chatbox.engine.lookup import Drafter
from chatbox.engine.metrics import EngineMetrics
from chatbox.engine.pacing import PrefillPacer, prefill_budget
from chatbox.engine.sampling import Sampler, top_logprobs
from chatbox.engine.slots import Slot, SlotTable
from chatbox.engine.types import (
    DoneEvent,
    EngineEvent,
    EngineStats,
    FinishReason,
    GenerationRequest,
    Timings,
    TokenEvent,
    TokenLogprob,
    Usage,
)

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Job:
    """One request as the decode thread sees it."""

    request: GenerationRequest
    prompt: list[int]
    sink: Callable[[EngineEvent], None]  # thread-safe delivery to the asyncio side
    public: int = 0  # leading prompt tokens other scopes may share (GenerationRequest)
    order: int = 0
    capture_logits: int = 0  # test hook: keep the logits of the first N sampled positions
    ignore_eog: bool = False  # benchmark hook: run to max_tokens even past end-of-turn
    lstrip: bool = False  # transcript prompts: the answer's first token carries a space
    logits: list[np.ndarray] = field(default_factory=list)
    cancelled: bool = False
    done: bool = False
    slot: Slot | None = None
    n_done: int = 0  # prompt tokens in KV
    cached: int = 0
    sampler: Sampler | None = None
    stream: StopTextStream | None = None
    pending: int | None = None  # sampled token waiting to be decoded
    drafter: Drafter | None = None  # prompt-lookup decoding (None: off)
    draft: list[int] = field(default_factory=list)  # guesses decoded after pending this step
    n_generated: int = 0
    t_submit: float = field(default_factory=time.perf_counter)
    t_last: float = 0.0
    t_admit: float = 0.0  # given a slot
    t_first: float = 0.0  # first token sampled
    forks: list[Job] = field(default_factory=list)  # more answers to this prompt (n > 1)
    held: list[TokenLogprob] = field(default_factory=list)  # logprobs of text not yet emitted

    def __lt__(self, other: Job) -> bool:
        return (self.request.priority, self.order) < (other.request.priority, other.order)


class Scheduler:
    def __init__(
        self,
        model: Model,
        ctx: Context,
        n_parallel: int,
        n_slots: int,
        n_ctx_per_seq: int,
        park_bytes: int,
        metrics: EngineMetrics,
        stall_ratio: float = 1.6,
        prefill_chunk: int = 64,
        max_idle_cells: int | None = None,
        disk: DiskStore | None = None,
        lookup_draft: int = 0,
    ) -> None:
        self.model = model
        self.ctx = ctx
        self.n_parallel = n_parallel
        self.n_ctx_per_seq = n_ctx_per_seq
        self.slots = SlotTable(ctx, n_slots, park_bytes, disk)
        self.lookup_draft = lookup_draft  # most tokens guessed per stream per step; 0: off
        self.drafted = 0  # guessed tokens verified, and how many of them were right
        self.accepted = 0
        self.metrics = metrics
        self.batch = Batch(ctx.n_batch)
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.waiting: list[Job] = []
        self.active: list[Job] = []
        self.stats = EngineStats(slots_total=n_parallel, kv_cells_total=ctx.n_ctx)
        self.max_idle_cells = ctx.n_ctx // 4 if max_idle_cells is None else max_idle_cells
        self.pacer = PrefillPacer(ctx.n_batch, stall_ratio, chunk=prefill_chunk)
        self._kv_starved = False
        self._thread: threading.Thread | None = None

    # -- other threads -------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="chatbox-decode", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self.inbox.put(None)
            self._thread.join()
            self._thread = None
        self.batch.free()
        if self.slots.disk is not None:
            self.slots.disk.close()  # finish writing what the shutdown parked

    def enqueue(self, job: Job) -> None:
        self.inbox.put(job)

    def wake(self) -> None:
        self.inbox.put(True)

    def call(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run fn on the decode thread between steps (for tests and diagnostics)."""
        fut: Future[Any] = Future()
        self.inbox.put((fn, fut))
        return fut

    # -- the decode thread ---------------------------------------------------------------
    def _run(self) -> None:
        order = 0
        while True:
            block = not (self.waiting or self.active)
            while True:
                try:
                    item = self.inbox.get(block=block)
                except queue.Empty:
                    break
                block = False
                if item is None:
                    self._shutdown()
                    return
                if isinstance(item, Job):
                    order += 1
                    item.order = order
                    heapq.heappush(self.waiting, item)
                elif isinstance(item, tuple):
                    fn, fut = item
                    try:
                        fut.set_result(fn())
                    except Exception as exc:
                        fut.set_exception(exc)
            try:
                self._reap()
                self._admit()
                if self.active:
                    self._step()
            except Exception as exc:  # a bug must not kill the thread or other engines
                log.exception("engine step failed")
                for job in list(self.active):
                    try:
                        self._finish(job, "error", f"internal engine error: {exc}")
                    except Exception:
                        job.done = True
                        self.active.remove(job)
            self._publish()

    def _reap(self) -> None:
        for job in [j for j in self.active if j.cancelled]:
            self._finish(job, "cancelled")
        if any(j.cancelled for j in self.waiting):
            for job in [j for j in self.waiting if j.cancelled]:
                for fork in [job, *job.forks]:
                    fork.done = True
                    fork.sink(DoneEvent("cancelled", Usage(prompt_tokens=len(job.prompt))))
                    self.metrics.finished("cancelled")
            self.waiting = [j for j in self.waiting if not j.cancelled]
            heapq.heapify(self.waiting)

    def _admit(self) -> None:
        while self.waiting and len(self.active) < self.n_parallel:
            job = self.waiting[0]
            adm = self.slots.acquire(
                job.prompt, job.request.cache_key, job.request.cache_scope, job.public
            )
            if adm is None:
                return
            heapq.heappop(self.waiting)
            job.t_admit = time.perf_counter()
            job.slot, job.n_done, job.cached = adm.slot, adm.reused, adm.reused
            adm.slot.persist = job.request.persist
            self.active.append(job)
            try:
                job.sampler = Sampler(job.request.sampling, self.model.n_vocab, self.model.vocab)
                job.sampler.accept_prompt(job.prompt)
                job.stream = StopTextStream(job.request.sampling.stop, job.lstrip)
                if self.lookup_draft > 0:
                    job.drafter = Drafter(job.prompt, self.lookup_draft)
            except Exception as exc:
                self._fail(job, exc)
                continue
            self.metrics.cache_hit.inc(adm.reused)
            self.metrics.cache_miss.inc(len(job.prompt) - adm.reused)

    def _build(self) -> list[tuple[Job, list[int], int | None]]:
        batch = self.batch
        batch.clear()
        rows: list[tuple[Job, list[int], int | None]] = []
        decoding = [j for j in self.active if j.pending is not None and j.slot is not None]
        spare = (batch.capacity - len(decoding)) // max(1, len(decoding))
        for job in decoding:
            assert job.pending is not None and job.slot is not None
            pos, seq = len(job.slot.tokens), job.slot.seq
            row = batch.add(job.pending, pos, seq, True)
            job.draft = self._draft(job, spare) if not self._kv_starved else []
            for k, tok in enumerate(job.draft):
                batch.add(tok, pos + 1 + k, seq, True)  # each guess gets its own logits row
            rows.append((job, [job.pending], row))
        prefilling = sorted(
            (j for j in self.active if j.pending is None),
            key=lambda j: (j.request.priority, len(j.prompt) - j.n_done),
        )
        room = batch.capacity - batch.n
        budget = (
            0
            if (rows and self._kv_starved)
            else prefill_budget(self.pacer, [job for job, _, _ in rows], prefilling, room)
        )
        for job in prefilling:
            if budget <= 0 or job.slot is None:
                break
            chunk = job.prompt[job.n_done : job.n_done + budget]
            last = job.n_done + len(chunk) == len(job.prompt)
            idx: int | None = None
            seq = job.slot.seq
            for k, tok in enumerate(chunk):
                want = last and k == len(chunk) - 1
                i = batch.add(tok, job.n_done + k, seq, want)
                if want:
                    idx = i
            rows.append((job, chunk, idx))
            budget -= len(chunk)
        return rows

    def _step(self) -> None:
        rows = self._build()
        if not rows:
            return
        n_decode = sum(1 + len(job.draft) for job, _, _ in rows if job.pending is not None)
        t0 = time.perf_counter()
        rc = self.ctx.decode(self.batch)
        while rc == DECODE_NO_KV_SPACE:
            busy = [j.slot for j in self.active if j.slot is not None]
            if self.slots.evict_one(exclude=busy):
                rc = self.ctx.decode(self.batch)
                continue
            if n_decode and n_decode < len(rows):
                self._kv_starved = True  # run only the decoders until something finishes
                return
            victim = max(self.active, key=lambda j: j.order)
            self._finish(victim, "error", "out of memory for this conversation; try again later")
            return
        elapsed = time.perf_counter() - t0
        if rc != DECODE_OK:
            for job, _, _ in rows:
                self._finish(job, "error", f"the model failed to decode (code {rc})")
            return
        self.pacer.observe(n_decode, self.batch.n - n_decode, elapsed)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "step: %d decode, %d prefill tokens, %.1f ms; decode %.1f ms, token %.2f ms,"
                " credit %.1f ms",
                n_decode,
                self.batch.n - n_decode,
                elapsed * 1000,
                self.pacer.decode_time * 1000,
                self.pacer.token_cost * 1000,
                self.pacer.credit * 1000,
            )
        for job, toks, idx in rows:
            assert job.slot is not None
            self.slots.append(job.slot, toks)
            if job.pending is not None:
                job.pending = None
            else:
                job.n_done += len(toks)
            if idx is not None:
                try:
                    self._verify(job, idx)
                except Exception as exc:  # one bad request must not take the batch down
                    self._fail(job, exc)
            job.draft = []

    def _fail(self, job: Job, exc: Exception) -> None:
        log.exception("request failed in the engine", exc_info=exc)
        self._finish(job, "error", f"internal engine error: {exc}")

    def _draft(self, job: Job, spare: int) -> list[int]:
        """Prompt-lookup guesses to decode after job.pending (within the batch and limits)."""
        if job.drafter is None or job.slot is None:
            return []
        left = job.request.sampling.max_tokens - job.n_generated - 1
        room = min(spare, left, self.n_ctx_per_seq - len(job.slot.tokens) - 2)
        return job.drafter.draft(room) if room > 0 else []

    def _verify(self, job: Job, idx: int) -> None:
        """Sample the rows of job's last decode: its next token, then one per guess for as
        long as the sampler agrees with the guesses. Rejected guesses' cells are removed."""
        assert job.slot is not None
        draft, accepted, reason = job.draft, 0, None
        for i in range(len(draft) + 1):
            tok, reason = self._sample(job, idx + i)
            if job.drafter is not None and reason is None:
                job.drafter.push(tok)
            if reason is not None or i == len(draft) or tok != draft[i]:
                break
            self.slots.append(job.slot, [tok])  # a right guess: its cell is already in KV
            accepted += 1
        if accepted < len(draft):
            self.ctx.seq_rm(job.slot.seq, len(job.slot.tokens), -1)
        if draft and job.drafter is not None:
            job.drafter.record(len(draft), accepted)
            self.drafted += len(draft)
            self.accepted += accepted
            self.metrics.draft_tokens.inc(len(draft))
            self.metrics.draft_accepted.inc(accepted)
        if reason is not None:
            self._finish(job, reason)

    def _sample(self, job: Job, idx: int) -> tuple[int, FinishReason | None]:
        """Sample one logits row; emit its text; return it and why the job ends (if it does)."""
        assert job.sampler is not None and job.stream is not None and job.slot is not None
        if len(job.logits) < job.capture_logits:
            job.logits.append(self.ctx.logits(idx))
        if job.forks:
            self._fork(job, idx)
        tok = job.sampler.sample(self.ctx.ptr, idx)
        if job.request.sampling.logprobs >= 0 and tok not in self.model.eog_ids:
            logp, top = top_logprobs(self.ctx.logits(idx), tok, job.request.sampling.logprobs)
            piece = self.model.piece
            job.held.append(TokenLogprob(piece(tok), logp, tuple((piece(t), p) for t, p in top)))
        now = time.perf_counter()
        if job.t_last == 0.0:
            job.t_first = now
            self.metrics.ttft.observe(now - job.t_submit)
        else:
            self.metrics.tpot.observe(now - job.t_last)
        job.t_last = now
        if tok in self.model.eog_ids and not job.ignore_eog:
            return tok, "stop"
        job.n_generated += 1
        self.metrics.tokens.inc()
        text = job.stream.feed(self.model.piece(tok))
        if text:
            job.sink(TokenEvent(text, logprobs=tuple(job.held)))
            job.held.clear()
        if job.stream.stopped:
            return tok, "stop"
        if (
            job.n_generated >= job.request.sampling.max_tokens
            or len(job.slot.tokens) + 1 >= self.n_ctx_per_seq
        ):
            return tok, "length"
        job.pending = tok
        return tok, None

    def _fork(self, job: Job, idx: int) -> None:
        """The prompt is prefilled: start the other answers from a copy of its KV, sampling
        their first tokens from the same logits row (n answers, one prefill)."""
        assert job.slot is not None
        forks, job.forks = job.forks, []
        for fork in forks:
            if fork.cancelled:
                self._finish(fork, "cancelled")
                continue
            slot = self.slots.fork(job.slot) if len(self.active) < self.n_parallel else None
            if slot is None:  # no free sequence: it queues and prefills on its own
                heapq.heappush(self.waiting, fork)
                continue
            fork.slot, fork.n_done, fork.cached = slot, len(fork.prompt), len(fork.prompt)
            self.active.append(fork)
            try:
                fork.sampler = Sampler(fork.request.sampling, self.model.n_vocab, self.model.vocab)
                fork.stream = StopTextStream(fork.request.sampling.stop, fork.lstrip)
                self._verify(fork, idx)  # samples its first token; may finish it
            except Exception as exc:
                self._fail(fork, exc)

    def _finish(self, job: Job, reason: FinishReason, error: str | None = None) -> None:
        if job.done:
            return
        job.done = True
        tail = ""
        if reason in ("stop", "length") and job.stream is not None:
            tail = job.stream.finish()
        if job.sampler is not None:
            job.sampler.free()
            job.sampler = None
        if job.slot is not None:
            self.slots.release(job.slot, keep=reason in ("stop", "length"))
            self.slots.trim_idle(self.max_idle_cells)
        if job in self.active:
            self.active.remove(job)
        self._kv_starved = False
        self._publish()  # stats are current before the caller hears "done"
        self.metrics.finished(reason)
        for fork in job.forks:  # the prompt never finished prefilling: they end with it
            self._finish(fork, reason, error)
        job.forks = []
        if tail:
            self._emit(job, TokenEvent(tail, logprobs=tuple(job.held)))
        self._emit(
            job,
            DoneEvent(
                reason,
                Usage(len(job.prompt), job.n_generated, job.cached),
                error,
                timings=timings(job),
            ),
        )

    @staticmethod
    def _emit(job: Job, event: EngineEvent) -> None:
        try:
            job.sink(event)
        except Exception:  # the listener is gone; nothing else to do
            log.debug("dropped an event for a finished listener", exc_info=True)

    def _shutdown(self) -> None:
        for job in list(self.active) + list(self.waiting):
            self._finish(job, "error", "the model was unloaded")
        self.waiting = []
        n = self.slots.park_all_to_disk()  # a restart finds idle conversations warm
        if n:
            log.info("parked %d idle conversation(s) on disk", n)
        self._publish()

    def _publish(self) -> None:
        used = self.slots.cells_used()
        cached = self.slots.cached_prefixes
        self.stats = EngineStats(
            queue_depth=len(self.waiting),
            running=len(self.active),
            slots_total=self.n_parallel,
            kv_cells_used=used,
            kv_cells_total=self.ctx.n_ctx,
            cached_prefixes=cached,
        )
        m = self.metrics
        m.queue_depth.set(len(self.waiting))
        m.running.set(len(self.active))
        m.kv_used.set(used)
        m.kv_total.set(self.ctx.n_ctx)
        m.cached_prefixes.set(cached)

    # -- diagnostics (run via call()) ----------------------------------------------------
    def clear_cache(self) -> int:
        """Drop every idle cached prefix (not parking it); return how many were dropped."""
        n = 0
        for slot in self.slots.slots:
            if not slot.busy and slot.tokens:
                self.slots.release(slot, keep=False)
                n += 1
        self.slots.parked.clear()
        self.slots.parked_size = 0
        if self.slots.disk is not None:
            self.slots.disk.clear().wait()
        self._publish()
        return n

    def forget(self, cache_key: str) -> threading.Event | None:
        """A conversation was deleted: drop its KV from the cache, RAM and disk (the event
        is set once the disk file is gone)."""
        done = self.slots.forget(cache_key)
        self._publish()
        return done

    def kv_report(self) -> dict[int, tuple[int, int]]:
        """seq -> (tokens the slot table believes are cached, llama.cpp's pos_max + 1)."""
        return {s.seq: (len(s.tokens), self.ctx.seq_pos_max(s.seq) + 1) for s in self.slots.slots}


def timings(job: Job) -> Timings:
    """Where a finished job's time went: waiting for a slot, prefill, decode."""
    end = time.perf_counter()
    admit = job.t_admit or end
    first = job.t_first or end
    return Timings(admit - job.t_submit, max(0.0, first - admit), max(0.0, end - first))
