"""Liveness, readiness and Prometheus metrics (for an admin, or a scraper with the token)."""

from __future__ import annotations

from typing import Any

from litestar import Controller, MediaType, Response, get
from litestar.status_codes import HTTP_200_OK, HTTP_503_SERVICE_UNAVAILABLE
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from chatbox.web.auth import AnyRequest, LoginRequired, provide_user, tokens_match
from chatbox.web.deps import AccountsDep, MetricsDep, ServicesDep, SettingsDep

# Litestar appends the charset to a text/ media type itself; a second one makes Prometheus 3's
# strict parser refuse the scrape.
METRICS_MEDIA_TYPE = "; ".join(
    part for part in CONTENT_TYPE_LATEST.split("; ") if not part.startswith("charset=")
)


def _refused(status: int, message: str) -> Response[Any]:
    body = {
        "error": {
            "message": message,
            "type": "authentication_error" if status == 401 else "permission_error",
        }
    }
    headers = {"WWW-Authenticate": 'Bearer realm="chatbox"'} if status == 401 else {}
    return Response(body, status_code=status, media_type=MediaType.JSON, headers=headers)


class HealthController(Controller):
    include_in_schema = False

    @get("/healthz")
    async def healthz(self) -> dict[str, str]:
        """The process is up and serving."""
        return {"status": "ok"}

    @get("/readyz")
    async def readyz(self, services: ServicesDep) -> Response[Any]:
        """Every default model (the default and each tier's) is loaded, start-up work
        (moderation's classifiers and encoders) has ended, and the database takes writes
        (`database_error` says why it does not); `models` gives each default model's state."""
        checks = await services.health()
        ready = all(checks[c] is True for c in ("model_loaded", "warmed_up", "database_writable"))
        return Response(
            {
                "status": "ready" if ready else "not ready",
                **checks,
                "models": services.model_states(),
            },
            status_code=HTTP_200_OK if ready else HTTP_503_SERVICE_UNAVAILABLE,
        )

    @get("/metrics", media_type=METRICS_MEDIA_TYPE)
    async def metrics(
        self, request: AnyRequest, metrics: MetricsDep, accounts: AccountsDep, settings: SettingsDep
    ) -> Response[Any]:
        """Prometheus text: for `Authorization: Bearer <metrics_token>`, or an admin's key or
        session; 401 for anyone else, 403 for a member."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if not (
            settings.metrics_token
            and scheme.lower() == "bearer"
            and tokens_match(token.strip(), settings.metrics_token)
        ):
            try:
                user = await provide_user(request, accounts, settings)
            except LoginRequired:
                return _refused(401, "send the metrics token or an admin's API key as Bearer")
            if user.role != "admin":
                return _refused(403, "only admins can read the metrics")
        return Response(generate_latest(metrics), media_type=METRICS_MEDIA_TYPE)
