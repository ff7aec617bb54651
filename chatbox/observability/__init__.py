"""Observability: Prometheus metrics, OpenTelemetry traces, structured logs, and the
console's in-process metric history. Imported by any layer; imports none of them."""

from chatbox.observability.logs import configure_logging, current_trace_id
from chatbox.observability.telemetry import Telemetry
from chatbox.observability.tracing import SpanView, TraceBuffer

__all__ = ["SpanView", "Telemetry", "TraceBuffer", "configure_logging", "current_trace_id"]
