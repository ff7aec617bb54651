"""The front door's part: an ASGI middleware that opens each request's root span, sets the
trace id header, counts requests by route template and status, and logs an access line.

It wraps the app's whole handler (outside routing), so requests that match no route (404s
for any path, 405s) are counted and traced too, under the fixed route label `<unmatched>`."""

from __future__ import annotations

import logging
import time
from typing import Any

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from chatbox.observability.telemetry import Telemetry

TRACE_HEADER = b"x-trace-id"
access_log = logging.getLogger("chatbox.access")
_propagator = TraceContextTextMapPropagator()
ASGIApp = Any  # (scope, receive, send) -> awaitable; typed loosely to stay framework-free
UNMATCHED = "<unmatched>"  # the route label of requests no route took (never the raw path)


def route_of(scope: dict[str, Any]) -> str:
    """The matched route template ('/c/{conv_id}'), never the raw path (unbounded).
    Known once the router has run: read it when the response starts, not before."""
    template = scope.get("path_template")
    return str(template) if template else UNMATCHED


def telemetry_middleware(telemetry: Telemetry) -> Any:
    """A middleware factory: wrap the app's handler (`app.asgi_handler`), outside routing."""

    def factory(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            method = str(scope.get("method", "GET"))
            headers = {
                bytes(k).decode("latin-1").lower(): bytes(v).decode("latin-1")
                for k, v in scope.get("headers", ())
            }
            parent = _propagator.extract(headers) if "traceparent" in headers else None
            t0 = time.perf_counter()
            state: dict[str, Any] = {"status": 500, "ttfb": None}
            # named for its route once routing has run (see the `finally` below)
            with telemetry.tracer.start_as_current_span(
                method,
                context=parent,
                kind=trace.SpanKind.SERVER,
                attributes={"http.request.method": method},
            ) as span:
                ctx = span.get_span_context()
                trace_id = format(ctx.trace_id, "032x").encode() if ctx.is_valid else b""

                async def send_with_id(message: Any) -> None:
                    if message["type"] == "http.response.start":
                        state["status"] = int(message["status"])
                        state["ttfb"] = time.perf_counter() - t0
                        if trace_id:
                            message = {
                                **message,
                                "headers": [*message.get("headers", ()), (TRACE_HEADER, trace_id)],
                            }
                    await send(message)

                try:
                    await app(scope, receive, send_with_id)
                finally:
                    status = int(state["status"])
                    route = route_of(scope)
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        span.set_status(trace.Status(trace.StatusCode.ERROR))
                    telemetry.http(method, route, status, state["ttfb"])
                    reason = (scope.get("state") or {}).get("auth_failure")
                    if reason:
                        telemetry.auth_failure(str(reason))
                    access_log.info(
                        "%s %s %d %.1f ms",
                        method,
                        route,
                        status,
                        (time.perf_counter() - t0) * 1000,
                    )

        return middleware

    return factory
