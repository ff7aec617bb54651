"""OpenTelemetry tracing: one TracerProvider per app, the last traces kept in memory for the
console, and OTLP export when an endpoint is configured."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider

MAX_SPANS_PER_TRACE = 500  # a runaway trace cannot hold the buffer's memory
TURN_SPAN = "turn"


@dataclass(frozen=True)
class SpanView:
    """One finished span as the console shows it (times in ms from the trace's start)."""

    span_id: str
    parent_id: str | None
    name: str
    start_ms: float
    duration_ms: float
    status: str
    attributes: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {
            "span_id": self.span_id,
            "parent_id": self.parent_id,
            "name": self.name,
            "start_ms": round(self.start_ms, 3),
            "duration_ms": round(self.duration_ms, 3),
            "status": self.status,
            "attributes": self.attributes,
        }


class TraceBuffer(SpanProcessor):
    """A span processor keeping the spans of the last `max_traces` traces (thread-safe)."""

    def __init__(self, max_traces: int = 200) -> None:
        self.max_traces = max_traces
        self._traces: OrderedDict[int, list[ReadableSpan]] = OrderedDict()
        self._lock = threading.Lock()

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        ctx = span.context
        if ctx is None:
            return
        with self._lock:
            spans = self._traces.get(ctx.trace_id)
            if spans is None:
                spans = self._traces[ctx.trace_id] = []
                while len(self._traces) > self.max_traces:
                    self._traces.popitem(last=False)
            if len(spans) < MAX_SPANS_PER_TRACE:
                spans.append(span)

    def shutdown(self) -> None:
        with self._lock:
            self._traces.clear()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def spans(self, trace_id: str) -> list[SpanView]:
        """The spans of one trace (by hex id), in start order; [] when it is not kept."""
        try:
            key = int(trace_id, 16)
        except ValueError:
            return []
        with self._lock:
            spans = list(self._traces.get(key, ()))
        if not spans:
            return []
        t0 = min(s.start_time or 0 for s in spans)
        out = []
        for s in sorted(spans, key=lambda s: s.start_time or 0):
            assert s.context is not None
            start, end = s.start_time or t0, s.end_time or s.start_time or t0
            out.append(
                SpanView(
                    format(s.context.span_id, "016x"),
                    format(s.parent.span_id, "016x") if s.parent else None,
                    s.name,
                    (start - t0) / 1e6,
                    (end - start) / 1e6,
                    s.status.status_code.name.lower(),
                    {k: _plain(v) for k, v in (s.attributes or {}).items()},
                )
            )
        return out

    def turns(self, limit: int = 50) -> list[dict[str, Any]]:
        """Kept traces holding a turn, slowest turn first: id, start, duration, model, status."""
        with self._lock:
            items = [(tid, list(spans)) for tid, spans in self._traces.items()]
        out = []
        for tid, spans in items:
            turn = next((s for s in spans if s.name == TURN_SPAN), None)
            if turn is None or turn.start_time is None or turn.end_time is None:
                continue
            attrs = turn.attributes or {}
            root = min(spans, key=lambda s: s.start_time or 0)
            out.append(
                {
                    "trace_id": format(tid, "032x"),
                    "root": root.name,
                    "started_at": turn.start_time / 1e9,
                    "duration_ms": round((turn.end_time - turn.start_time) / 1e6, 3),
                    "model": attrs.get("chatbox.model", ""),
                    "status": attrs.get("chatbox.turn_status", turn.status.status_code.name),
                    "spans": len(spans),
                }
            )
        out.sort(key=lambda t: -float(str(t["duration_ms"])))
        return out[:limit]


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


class Tracing:
    """The app's tracer: spans go to the in-memory buffer, and over OTLP when configured."""

    def __init__(
        self, enabled: bool = True, otlp_endpoint: str | None = None, keep_traces: int = 200
    ) -> None:
        self.buffer = TraceBuffer(keep_traces)
        self.enabled = enabled
        self._provider: TracerProvider | None = None
        if not enabled:
            self.tracer: trace.Tracer = trace.NoOpTracer()
            return
        provider = TracerProvider(resource=Resource.create({"service.name": "chatbox"}))
        provider.add_span_processor(self.buffer)
        if otlp_endpoint:
            # Imported only when used: the exporter pulls in protobuf and an HTTP client.
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            url = otlp_endpoint.rstrip("/") + "/v1/traces"
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
        self._provider = provider
        self.tracer = provider.get_tracer("chatbox")

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()  # flushes the OTLP batch
