"""Shadow traffic and pre-warming for admins: the admin API (what `chatbox shadow` talks to)
and the console's pages (the comparisons; each model's profile and forecast beside its load)."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Response, get, post
from litestar.exceptions import NotFoundException, PermissionDeniedException
from msgspec import Struct, convert

from chatbox.accounts import User
from chatbox.chat.rollout.prewarm import PreWarmer
from chatbox.chat.rollout.shadow import ShadowTraffic
from chatbox.services.server import Services
from chatbox.web.auth import AnyRequest
from chatbox.web.console.actions import page, require_admin
from chatbox.web.deps import ServicesDep, UserDep
from chatbox.web.errors import ERROR_RESPONSES
from chatbox.web.ui.helpers import UI_EXCEPTION_HANDLERS


class ShadowStartIn(Struct, forbid_unknown_fields=True):
    candidate: str
    tier: str
    percent: float


class ShadowStopIn(Struct, forbid_unknown_fields=True):
    tier: str


class ShadowStatusOut(Struct, forbid_unknown_fields=True):
    """The shadow rules per tier, each pair's comparison and the recent comparisons."""

    rules: list[dict[str, Any]]
    summary: list[dict[str, Any]]
    outcomes: list[dict[str, Any]]
    recent: list[dict[str, Any]]


class PrewarmOut(Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """Each model's profile and forecast, and the pre-warmer's recent decisions."""

    enabled: bool
    now: float | None = None  # absent while the pre-warmer does not run
    models: list[dict[str, Any]]
    decisions: list[dict[str, Any]]


def _admin(user: User) -> None:
    if user.role != "admin":
        raise PermissionDeniedException("only admins can manage shadow traffic")


def _shadow(services: Services) -> ShadowTraffic:
    if services.shadow is None:
        raise NotFoundException("shadow traffic does not run in this process")
    return services.shadow


async def _prewarm(services: Services) -> dict[str, Any]:
    warmer: PreWarmer | None = services.prewarm
    if warmer is None:
        return {"enabled": False, "models": [], "decisions": []}
    return {"enabled": True, **await warmer.view()}


class ShadowController(Controller):
    path = "/v1/admin"
    tags = ["admin"]

    @get("/shadow")
    async def status(self, services: ServicesDep, user: UserDep) -> ShadowStatusOut:
        """The shadow rules per tier, each pair's comparison and the recent comparisons."""
        _admin(user)
        return convert(_shadow(services).status(), ShadowStatusOut)

    @post("/shadow/start", status_code=200, responses=ERROR_RESPONSES)
    async def start(
        self, data: ShadowStartIn, services: ServicesDep, user: UserDep
    ) -> ShadowStatusOut:
        """Mirror `percent` of `tier`'s answers to `candidate` once each is done (audited)."""
        _admin(user)
        await _shadow(services).start(user, data.candidate, data.tier, data.percent)
        return convert(_shadow(services).status(), ShadowStatusOut)

    @post("/shadow/stop", status_code=200, responses=ERROR_RESPONSES)
    async def stop(
        self, data: ShadowStopIn, services: ServicesDep, user: UserDep
    ) -> ShadowStatusOut:
        """Stop mirroring the tier's answers (audited)."""
        _admin(user)
        await _shadow(services).stop(user, data.tier)
        return convert(_shadow(services).status(), ShadowStatusOut)

    @get("/prewarm")
    async def prewarm(self, services: ServicesDep, user: UserDep) -> PrewarmOut:
        """Each model's hour-of-week profile, its forecast beside its actual requests over
        the day around now, and the pre-warmer's recent loads and unloads."""
        _admin(user)
        return convert(await _prewarm(services), PrewarmOut)


class ConsoleShadowController(Controller):
    path = "/console"
    include_in_schema = False
    exception_handlers = UI_EXCEPTION_HANDLERS

    @get("/shadow", name="console_shadow")
    async def shadow_page(
        self, request: AnyRequest, services: ServicesDep, user: UserDep
    ) -> Response[str]:
        require_admin(user)
        return page(request, "console_shadow.html", "shadow", shadow=_shadow(services).status())

    @get("/prewarm", name="console_prewarm")
    async def prewarm_page(
        self, request: AnyRequest, services: ServicesDep, user: UserDep
    ) -> Response[str]:
        require_admin(user)
        return page(request, "console_prewarm.html", "prewarm", prewarm=await _prewarm(services))
