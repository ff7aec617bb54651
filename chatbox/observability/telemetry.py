"""`Telemetry`: one app's metrics, tracer and metric history, handed to every layer.

Layers call its small methods (`span`, `admission`, `store_op`, ...); with telemetry off
(`Telemetry.off()`, or settings.telemetry False) they cost next to nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode
from prometheus_client import CollectorRegistry

from chatbox.observability.alerts import Alert, Alerts
from chatbox.observability.metrics import AppMetrics
from chatbox.observability.ring import MetricRing
from chatbox.observability.tracing import TURN_SPAN, Tracing

log = logging.getLogger("chatbox.observability")
# A replay's fast clock samples at most this often in real seconds (the registry read costs).
MIN_SAMPLE_S = 0.5
KEEP_BASELINES_EVERY = 12  # samples between writes of the alert baselines (a minute at 5 s)
_kept: ContextVar[list[bool] | None] = ContextVar("chatbox_turn_kept", default=None)


class Telemetry:
    """Metrics (in `registry`), traces and the console's metric ring of one app."""

    def __init__(
        self,
        registry: CollectorRegistry | None,
        *,
        enabled: bool = True,
        otlp_endpoint: str | None = None,
        keep_traces: int = 200,
        sample_s: float = 5.0,
        history_s: float = 3600.0,
        alerts: Alerts | None = None,
    ) -> None:
        self.enabled = enabled and registry is not None
        self.metrics = AppMetrics(registry) if self.enabled and registry is not None else None
        self.tracing = Tracing(self.enabled, otlp_endpoint if self.enabled else None, keep_traces)
        self.tracer = self.tracing.tracer
        self.ring = MetricRing(registry, sample_s, history_s)
        self.alerts = alerts if alerts is not None else Alerts()  # read each sample
        self._sampler: asyncio.Task[None] | None = None
        self.clock: Callable[[], float] = time.time
        self.speed = 1.0
        self._samples = 0

    @classmethod
    def off(cls) -> Telemetry:
        """No metrics and no traces (tests of other layers, benchmarks' baseline)."""
        return cls(None, enabled=False)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self, clock: Callable[[], float] = time.time, speed: float = 1.0) -> None:
        """Start filling the metric ring every `sample_s` of `clock`, which runs `speed`
        times as fast as the real time (a replay's): samples, windows and alerts follow it."""
        self.clock, self.speed = clock, max(1.0, speed)
        if self.ring.registry is not None and self._sampler is None:
            self._sampler = asyncio.create_task(self._sample_forever())

    async def _sample_forever(self) -> None:
        every = self.ring.interval_s
        real_s = max(min(every, MIN_SAMPLE_S), every / self.speed)
        while True:
            try:
                await self.sample_once(self.clock())
            except Exception:  # a bad sample must not end the history
                log.exception("metric sample failed")
            await asyncio.sleep(real_s)

    async def sample_once(self, at: float) -> list[Alert]:
        """One sample of the ring at `at`, the alert rules run on it, their changes sent."""
        if self.metrics is not None and self.alerts.disk is not None:
            used = await asyncio.to_thread(self.alerts.disk)
            if used is not None:
                self.metrics.disk_used.set(used)
        row = self.ring.sample(at)
        now, before = self.ring.latest()
        if now is None:
            return []
        changed = self.alerts.evaluate(row, now, before, at)
        await self.alerts.notify(changed)
        self._samples += 1
        if self._samples % KEEP_BASELINES_EVERY == 0:
            await asyncio.to_thread(self.alerts.save_baselines)
        return changed

    async def stop(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
            self._sampler = None
            await asyncio.to_thread(self.alerts.save_baselines)
        await asyncio.to_thread(self.tracing.shutdown)

    # -- spans ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def span(self, name: str, **attributes: Any) -> Iterator[Span]:
        """A child span of the current one for the block (exceptions mark it as an error)."""
        with self.tracer.start_as_current_span(name, attributes=_attrs(attributes)) as span:
            yield span

    @contextlib.contextmanager
    def turn(self, **attributes: Any) -> Iterator[Span]:
        """The span of one turn: current in the block, ended at its exit unless the block
        hands it to the background work that finishes the turn (`hand_off_turn`)."""
        span = self.tracer.start_span(TURN_SPAN, attributes=_attrs(attributes))
        kept = [False]
        token = _kept.set(kept)
        try:
            with trace.use_span(span, end_on_exit=False):
                yield span
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            span.end()
            raise
        finally:
            _kept.reset(token)
        if not kept[0]:
            span.end()

    def hand_off_turn(self) -> Callable[[object], None]:
        """Keep the current turn's span open; the returned callback ends it (a task's
        done callback)."""
        span = trace.get_current_span()
        kept = _kept.get()
        if kept is not None:
            kept[0] = True
        return lambda _done: span.end()

    def annotate(self, **attributes: Any) -> None:
        """Set attributes on the current span (e.g. the turn's model and status)."""
        trace.get_current_span().set_attributes(_attrs(attributes))

    def engine_phases(
        self, model: str, queued_s: float, prefill_s: float, decode_s: float, **attrs: Any
    ) -> None:
        """Record the engine's span and its phases, which ended just now (times measured on
        the decode thread): queue wait, prefill (to the first token), decode."""
        if not self.enabled:
            return
        end = time.time_ns()
        decode0 = end - int(decode_s * 1e9)
        prefill0 = decode0 - int(prefill_s * 1e9)
        queue0 = prefill0 - int(queued_s * 1e9)
        engine = self.tracer.start_span(
            "engine", start_time=queue0, attributes=_attrs({"chatbox.model": model, **attrs})
        )
        ctx = trace.set_span_in_context(engine)
        for name, start, stop in (
            ("engine.queue_wait", queue0, prefill0),
            ("engine.prefill", prefill0, decode0),
            ("engine.decode", decode0, end),
        ):
            self.tracer.start_span(name, context=ctx, start_time=start).end(end_time=stop)
        engine.end(end_time=end)

    # -- metrics -------------------------------------------------------------------------

    def http(self, method: str, route: str, status: int, seconds: float | None) -> None:
        if self.metrics is None:
            return
        self.metrics.http_requests.labels(method, route, str(status)).inc()
        if seconds is not None:
            self.metrics.http_duration.labels(method, route).observe(seconds)

    def admission(self, tier: str, decision: str, limit: str = "") -> None:
        if self.metrics is not None:
            self.metrics.admission.labels(tier, decision, limit).inc()

    def answer_cache(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.answer_cache.labels(outcome).inc()

    def answer_cache_size(self, entries: int, size: int) -> None:
        if self.metrics is not None:
            self.metrics.answer_cache_entries.set(entries)
            self.metrics.answer_cache_bytes.set(size)

    def semantic_cache(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.semantic_cache.labels(outcome).inc()

    def semantic_cache_size(self, entries: int, size: int) -> None:
        if self.metrics is not None:
            self.metrics.semantic_cache_entries.set(entries)
            self.metrics.semantic_cache_bytes.set(size)

    def auth_failure(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.auth_failures.labels(reason).inc()

    def embedded(self, purpose: str, texts: int, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.embeddings.labels(purpose).inc(texts)
            self.metrics.embedding_duration.labels(purpose).observe(seconds)

    def ingested(self, outcome: str, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.ingestions.labels(outcome).inc()
            if outcome == "stored":
                self.metrics.ingestion_duration.observe(seconds)

    def retrieved(self, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.retrieval_duration.observe(seconds)

    def store_op(self, op: str, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.store_duration.labels(op).observe(seconds)

    def conversation_read(self, served_by: str, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.conversation_reads.labels(served_by, reason).inc()

    def turn_finished(self, model: str, status: str) -> None:
        if self.metrics is not None:
            self.metrics.turns.labels(model, status).inc()

    def feedback_given(self, model: str, arm: str, rating: str) -> None:
        if self.metrics is not None:
            self.metrics.feedback.labels(model, arm, rating).inc()


def _attrs(attributes: dict[str, Any]) -> dict[str, Any]:
    """OpenTelemetry takes str, bool, int, float (and lists of them); None is left out."""
    return {
        k: v if isinstance(v, str | bool | int | float) else str(v)
        for k, v in attributes.items()
        if v is not None
    }
