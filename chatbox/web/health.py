"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Response, get
from litestar.status_codes import HTTP_200_OK, HTTP_503_SERVICE_UNAVAILABLE
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from chatbox.web.deps import MetricsDep, ServicesDep


class HealthController(Controller):
    include_in_schema = False

    @get("/healthz")
    async def healthz(self) -> dict[str, str]:
        """The process is up and serving."""
        return {"status": "ok"}

    @get("/readyz")
    async def readyz(self, services: ServicesDep) -> Response[Any]:
        """The default model is loaded and the database takes writes."""
        checks = await services.health()
        ready = all(checks.values())
        return Response(
            {"status": "ready" if ready else "not ready", **checks},
            status_code=HTTP_200_OK if ready else HTTP_503_SERVICE_UNAVAILABLE,
        )

    @get("/metrics", media_type=CONTENT_TYPE_LATEST)
    async def metrics(self, metrics: MetricsDep) -> bytes:
        return generate_latest(metrics)
