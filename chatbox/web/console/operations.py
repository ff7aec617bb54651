"""The admin console's Replicas and Alerts pages: each replica's state, models and load with
draining and undraining; the alerts firing now, their recent changes, and silencing one for a
while. The posts are htmx with the session's CSRF token, answer with the page, and are
audit-logged by the services they call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from litestar import Controller, Response, get, post
from litestar.exceptions import ClientException, NotFoundException

from chatbox.cluster.admin import UnknownReplica
from chatbox.services.alerts import MAX_SILENCE_MIN, AlertSilences
from chatbox.services.server import Services
from chatbox.web.auth import AnyRequest
from chatbox.web.console.actions import page, require_admin
from chatbox.web.deps import ServicesDep, UserDep
from chatbox.web.ui.helpers import FORM, UI_EXCEPTION_HANDLERS

# What the silence form offers, in minutes.
SILENCE_PERIODS = ((30, "30 minutes"), (60, "1 hour"), (240, "4 hours"), (1440, "1 day"))


@dataclass
class ReplicaForm:
    url: str = ""


@dataclass
class SilenceForm:
    alertname: str = ""
    instance: str = ""
    minutes: int = 60


def _silences(services: Services) -> AlertSilences:
    return AlertSilences(services.telemetry, services.accounts.audit)


def _replicas_page(request: AnyRequest, services: Services, notice: str = "") -> Response[str]:
    return page(
        request,
        "console_replicas.html",
        "replicas",
        replicas=services.replicas.list(),
        notice=notice,
    )


def _alerts_page(request: AnyRequest, services: Services, notice: str = "") -> Response[str]:
    return page(
        request,
        "console_alerts.html",
        "alerts",
        alerts=services.telemetry.alerts.state_out(),
        periods=SILENCE_PERIODS,
        notice=notice,
    )


class ConsoleOperationsController(Controller):
    path = "/console"
    include_in_schema = False
    exception_handlers = UI_EXCEPTION_HANDLERS

    @get("/replicas", name="console_replicas")
    async def replicas(
        self, request: AnyRequest, services: ServicesDep, user: UserDep
    ) -> Response[str]:
        require_admin(user)
        return _replicas_page(request, services)

    @post("/replicas/drain", status_code=200, name="console_replica_drain")
    async def drain(
        self,
        request: AnyRequest,
        services: ServicesDep,
        user: UserDep,
        data: Annotated[ReplicaForm, FORM],
    ) -> Response[str]:
        """Stop new work on a replica; answers running there finish."""
        require_admin(user)
        return await self._drain(request, services, user, data.url, True)

    @post("/replicas/undrain", status_code=200, name="console_replica_undrain")
    async def undrain(
        self,
        request: AnyRequest,
        services: ServicesDep,
        user: UserDep,
        data: Annotated[ReplicaForm, FORM],
    ) -> Response[str]:
        """Let a drained replica take new work again."""
        require_admin(user)
        return await self._drain(request, services, user, data.url, False)

    async def _drain(
        self, request: AnyRequest, services: Services, user: UserDep, url: str, drain: bool
    ) -> Response[str]:
        try:
            view = await services.replicas.drain(user, url, drain)
        except UnknownReplica as exc:
            raise NotFoundException(f"no replica {url}") from exc
        what = "drains: running answers finish, new ones go elsewhere" if drain else "takes work"
        return _replicas_page(request, services, f"{view['url']} {what}.")

    @get("/alerts", name="console_alerts")
    async def alerts(
        self, request: AnyRequest, services: ServicesDep, user: UserDep
    ) -> Response[str]:
        require_admin(user)
        return _alerts_page(request, services)

    @post("/alerts/silence", status_code=200, name="console_alert_silence")
    async def silence(
        self,
        request: AnyRequest,
        services: ServicesDep,
        user: UserDep,
        data: Annotated[SilenceForm, FORM],
    ) -> Response[str]:
        """Post nothing for an alert (one instance, or all) for a while."""
        require_admin(user)
        if not 1 <= data.minutes <= MAX_SILENCE_MIN:
            raise ClientException(f"silence for 1 to {MAX_SILENCE_MIN} minutes")
        try:
            made = await _silences(services).silence(
                user, data.alertname, data.instance.strip(), data.minutes
            )
        except ValueError as exc:
            raise ClientException(str(exc)) from exc
        which = f"{made.alertname} ({made.instance})" if made.instance else made.alertname
        return _alerts_page(
            request, services, f"{which} is silenced until {made.as_dict()['endsAt']}."
        )

    @post("/alerts/unsilence", status_code=200, name="console_alert_unsilence")
    async def unsilence(
        self,
        request: AnyRequest,
        services: ServicesDep,
        user: UserDep,
        data: Annotated[SilenceForm, FORM],
    ) -> Response[str]:
        require_admin(user)
        if not await _silences(services).unsilence(user, data.alertname, data.instance):
            raise NotFoundException(f"{data.alertname} is not silenced")
        return _alerts_page(request, services, f"{data.alertname} is no longer silenced.")
