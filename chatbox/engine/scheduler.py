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
from typing import Any

from chatbox.engine.batching import build_batch, deepest
from chatbox.engine.idle import IdleWork
from chatbox.engine.job import Job, start_sampling, timings
from chatbox.engine.kv.disk import DiskStore
from chatbox.engine.kv.forks import start_forks
from chatbox.engine.kv.slots import SlotTable
from chatbox.engine.llama import DECODE_NO_KV_SPACE, DECODE_OK, Batch, Context, Model
from chatbox.engine.metrics import EngineMetrics
from chatbox.engine.outbox import Outbox
from chatbox.engine.pacing import PrefillPacer
from chatbox.engine.sampling import top_logprobs
from chatbox.engine.speculative import step as speculative
from chatbox.engine.speculative.lookup import Prior
from chatbox.engine.speculative.stepcost import StepCosts
from chatbox.engine.tuning import ThreadTuner
from chatbox.engine.types import (
    DoneEvent,
    EngineEvent,
    EngineStats,
    FinishReason,
    TokenEvent,
    TokenLogprob,
    Usage,
)

log = logging.getLogger(__name__)
# Between steps the stats are refreshed this often unless the queue or running set changed:
# refreshing them every step would cost the decode thread ~45 us a step.
PUBLISH_EVERY_S = 0.05


class Scheduler:
    """The decode thread and the state only it touches (slots, queue, running jobs)."""

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
        idle_cells: tuple[int, int] | None = None,
        disk: DiskStore | None = None,
        lookup_draft: int = 0,
        tuner: ThreadTuner | None = None,
        stream_interval_s: float = 0.0,
    ) -> None:
        self.model = model
        self.ctx = ctx
        self.n_parallel = n_parallel
        self.n_ctx_per_seq = n_ctx_per_seq
        self.slots = SlotTable(ctx, n_slots, park_bytes, disk, shared=ctx.kv_unified)
        self.lookup_draft = lookup_draft  # most tokens guessed per stream per step; 0: off
        self.drafted = self.accepted = 0  # guessed tokens verified, and how many were right
        self.costs = StepCosts()  # what a step costs by size: whether guesses pay
        self.prior = Prior()  # how often guesses come true lately: a new stream's start
        self.metrics = metrics
        self.batch = Batch(ctx.n_batch)
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.waiting: list[Job] = []
        self.active: list[Job] = []
        self.stats = EngineStats(slots_total=n_parallel, kv_cells_total=ctx.n_ctx)
        # Live idle-prefix cells allowed while 2+ streams decode, and otherwise (tuning.py).
        self.idle_cells = idle_cells or (ctx.n_ctx // 4, ctx.n_ctx // 4)
        self.pacer = PrefillPacer(ctx.n_batch, stall_ratio, chunk=prefill_chunk)
        self._kv_starved = False
        self._thread: threading.Thread | None = None
        self.tuner = tuner  # None: the context's thread counts, as they are
        self.idle = IdleWork(n_ctx_per_seq, self.slots)  # work between answers
        self.outbox = Outbox(stream_interval_s)  # a step's events: one wake-up per loop
        self._shape, self._published_at = (0, 0), 0.0  # what _publish last published, when

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
        self.outbox.owner = threading.get_ident()
        order = 0
        while True:
            block = not (self.waiting or self.active)
            if block and self.tuner is not None:
                self.tuner.idle()  # idle time is not part of any step
            while block or not self.inbox.empty():  # (raising Empty costs every step)
                try:
                    item = self.inbox.get(block, self.idle.wait_s() if block else None)
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
                    if not fut.set_running_or_notify_cancel():  # its caller gave up
                        continue
                    try:
                        fut.set_result(fn())
                    except Exception as exc:
                        fut.set_exception(exc)
            try:
                self._reap()
                self._admit()
                if self.active:
                    self._step()
                elif not self.waiting:  # idle: the next turns' markers, parking ahead
                    self.idle.run(self.ctx, self.batch)
            except Exception as exc:  # a bug must not kill the thread or other engines
                log.exception("engine step failed")
                for job in list(self.active):
                    try:
                        self.finish(job, "error", f"internal engine error: {exc}")
                    except Exception:
                        job.done = True
                        self.active.remove(job)
            self.outbox.flush()
            self._publish(every=PUBLISH_EVERY_S)
            if self.slots.disk is not None:  # the disk tier writes while nothing decodes
                self.slots.disk.decoding(bool(self.waiting or self.active))

    def _reap(self) -> None:
        for job in [j for j in self.active if j.cancelled]:
            self.finish(job, "cancelled")
        if any(j.cancelled for j in self.waiting):
            for job in [j for j in self.waiting if j.cancelled]:
                for fork in [job, *job.forks]:
                    fork.done = True
                    fork.sink(DoneEvent("cancelled", Usage(prompt_tokens=len(job.prompt))))
                    if job.request.metered:
                        self.metrics.finished("cancelled")
            self.waiting = [j for j in self.waiting if not j.cancelled]
            heapq.heapify(self.waiting)

    def _admit(self) -> None:
        if self.waiting:  # nothing erased elsewhere is reused or kept past this point
            self.slots.drop_erased()
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
                start_sampling(job, self.model, True, self.lookup_draft, self.prior)
            except Exception as exc:
                self.fail(job, exc)
                continue
            self.metrics.cache_hit.inc(adm.reused)
            self.metrics.cache_miss.inc(len(job.prompt) - adm.reused)
            if len(self.active) == 2 and self.idle_cells[0] < self.idle_cells[1]:
                self._trim(busy=True)  # steps are shared from now on

    def _step(self) -> None:
        self.slots.arrange()  # streams: busy sequences on consecutive ids, one pass a step
        rows = build_batch(
            self.batch, self.active, self.pacer, self._kv_starved, self.n_ctx_per_seq, self.costs
        )
        if not rows:
            return
        n_decode = sum(1 + len(job.draft) for job, _, _ in rows if job.pending is not None)
        tuner, depth = self.tuner, deepest(rows)
        t0 = time.perf_counter()
        if tuner is not None:  # compared with steps of its size and depth
            t0 = tuner.begin(self.batch.n, self.ctx.set_threads, depth)
        rc = self.ctx.decode(self.batch)
        while rc == DECODE_NO_KV_SPACE:
            if tuner is not None:
                tuner.idle()  # an eviction and a retry: not a normal step
            busy = [j.slot for j in self.active if j.slot is not None]
            # idle prefixes free cells only in a shared pool (a stream holds only its own)
            if self.slots.shared and self.slots.evict_one(exclude=busy):
                rc = self.ctx.decode(self.batch)
                continue
            if n_decode and n_decode < len(rows):
                self._kv_starved = True  # run only the decoders until something finishes
                return
            victim = max(self.active, key=lambda j: j.order)
            self.finish(victim, "error", "out of memory for this conversation; try again later")
            return
        elapsed = time.perf_counter() - t0
        if tuner is not None:
            tuner.end(elapsed)
        self.costs.observe(self.batch.n, len(rows), depth, elapsed)
        if rc != DECODE_OK:
            for job, _, _ in rows:
                self.finish(job, "error", f"the model failed to decode (code {rc})")
            return
        self.pacer.observe(n_decode, self.batch.n - n_decode, elapsed)
        for job, toks, idx in rows:
            assert job.slot is not None
            self.slots.append(job.slot, toks)
            if job.pending is not None:
                job.pending = None
            else:
                job.n_done += len(toks)
            if idx is not None:
                try:
                    self.verify(job, idx)
                except Exception as exc:  # one bad request must not take the batch down
                    self.fail(job, exc)
            job.draft = []

    def _trim(self, busy: bool) -> None:
        """Park idle prefixes beyond the budget (the smaller one while streams share steps)."""
        self.slots.trim_idle(self.idle_cells[0] if busy else self.idle_cells[1])

    def fail(self, job: Job, exc: Exception) -> None:
        log.exception("request failed in the engine", exc_info=exc)
        self.finish(job, "error", f"internal engine error: {exc}")

    def verify(self, job: Job, idx: int) -> None:
        """Sample job's rows of the last decode (its next token and any guesses after it),
        count the guesses, and finish the job if it ended."""
        n_draft = len(job.draft)
        accepted, reason = speculative.verify(job, idx, self._sample, self.slots, self.ctx)
        if n_draft and job.drafter is not None:
            self.drafted += n_draft
            self.accepted += accepted
            self.metrics.draft_tokens.inc(n_draft)
            self.metrics.draft_accepted.inc(accepted)
        if reason is not None:
            self.finish(job, reason)

    def _sample(self, job: Job, idx: int) -> tuple[int, FinishReason | None]:
        """Sample one logits row; emit its text; return it and why the job ends (if it does)."""
        assert job.sampler is not None and job.stream is not None and job.slot is not None
        if len(job.logits) < job.capture_logits:
            job.logits.append(self.ctx.logits(idx))
        if job.forks:
            start_forks(job, idx, self)
        tok = job.last = job.sampler.sample(self.ctx, idx)
        if job.request.sampling.logprobs >= 0 and tok not in self.model.eog_ids:
            logp, top = top_logprobs(self.ctx.logits(idx), tok, job.request.sampling.logprobs)
            piece = self.model.piece
            job.held.append(TokenLogprob(piece(tok), logp, tuple((piece(t), p) for t, p in top)))
        now = time.perf_counter()
        if job.t_last == 0.0:
            job.t_first = now
            if job.request.metered:
                self.metrics.ttft.observe(now - job.t_submit)
        elif job.request.metered:
            self.metrics.clock.tpot(now - job.t_last)
        job.t_last = now
        if tok in self.model.eog_ids and not job.ignore_eog:
            return tok, "stop"
        job.n_generated += 1
        self.metrics.clock.tokens += 1
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

    def finish(self, job: Job, reason: FinishReason, error: str | None = None) -> None:
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
            self.idle.ended(job, reason)
            self._trim(busy=sum(1 for j in self.active if j is not job) >= 2)
        if job in self.active:
            self.active.remove(job)
        self._kv_starved = False
        self._publish()  # stats are current before the caller hears "done"
        if job.request.metered:
            self.metrics.finished(reason)
        for fork in job.forks:  # the prompt never finished prefilling: they end with it
            self.finish(fork, reason, error)
        job.forks = []
        if tail or job.held:  # a last token whose half character was dropped keeps its logprob
            self._emit(job, TokenEvent(tail, logprobs=tuple(job.held)))
        usage = Usage(len(job.prompt), job.n_generated, job.cached)
        self._emit(job, DoneEvent(reason, usage, error, timings=timings(job)))

    @staticmethod
    def _emit(job: Job, event: EngineEvent) -> None:
        try:
            job.sink(event)
        except Exception:  # the listener is gone; nothing else to do
            log.debug("dropped an event for a finished listener", exc_info=True)

    def _shutdown(self) -> None:
        for job in list(self.active) + list(self.waiting):
            self.finish(job, "error", "the model was unloaded")
        self.waiting = []
        self.slots.drop_erased()
        n = self.slots.park_all_to_disk()  # a restart finds idle conversations warm
        if n:
            log.info("parked %d idle conversation(s) on disk", n)
        self._publish()
        self.outbox.flush(force=True)

    def _publish(self, every: float = 0.0) -> None:
        """Make the stats and gauges current; with `every`, only if the queue or the running
        set changed or `every` seconds passed (only the KV figures move on other steps)."""
        now = time.perf_counter()
        shape = (len(self.waiting), len(self.active))
        if every and shape == self._shape and now - self._published_at < every:
            return
        self._shape, self._published_at = shape, now
        self.stats = EngineStats(
            queue_depth=len(self.waiting),
            running=len(self.active),
            slots_total=self.n_parallel,
            kv_cells_used=self.slots.cells_used(),
            kv_cells_total=self.ctx.n_ctx,
            cached_prefixes=self.slots.cached_prefixes,
        )
        self.metrics.publish(self.stats)

    # -- diagnostics (run via call()) ----------------------------------------------------
    def clear_cache(self) -> int:
        """Drop every idle cached prefix (not parking it); return how many were dropped."""
        n = 0
        for slot in self.slots.slots:
            if not slot.busy and slot.tokens:
                self.slots.release(slot, keep=False)
                n += 1
        self.slots.parked.clear()
        self.slots.heads.clear()
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

    def forget_scope(self, scope: str) -> threading.Event | None:
        """An account was erased: drop every KV of its scope from the cache, RAM and disk."""
        done = self.slots.forget_scope(scope)
        self._publish()
        return done
