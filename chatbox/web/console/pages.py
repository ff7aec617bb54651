"""The admin console's pages and their JSON data: live plots, traces, people, models, the
audit log. Admins only: a member gets 403, anyone not logged in goes to the login page."""

from __future__ import annotations

from typing import Any

from litestar import Response, get
from litestar.exceptions import NotFoundException
from litestar.response import Redirect

from chatbox.accounts.audit import entry_out
from chatbox.accounts.people import People
from chatbox.cluster.local import LOCAL
from chatbox.web.auth import AnyRequest
from chatbox.web.console.actions import (
    AUDIT_PAGE,
    ConsoleActions,
    model_admin,
    page,
    person_page,
    require_admin,
    tiers,
)
from chatbox.web.deps import ServicesDep, UserDep


class ConsoleController(ConsoleActions):
    """The pages (GET) here; the actions (POST) in `ConsoleActions`."""

    @get("/", name="console")
    async def index(self, user: UserDep) -> Redirect:
        require_admin(user)
        return Redirect("/console/live")

    # -- live ------------------------------------------------------------------------------

    @get("/live", name="console_live")
    async def live(
        self, request: AnyRequest, services: ServicesDep, user: UserDep
    ) -> Response[str]:
        require_admin(user)
        models = services.models.pool.loaded()
        # Router mode (some remote replica): plots per member of the fleet, "local" included
        members = services.replicas.list()
        remote = any(r["source"] != LOCAL for r in members)
        replicas = [r["url"] for r in members] if remote else []
        served = sorted({m for r in members if r["source"] != LOCAL for m in r["models"]})
        return page(
            request,
            "console_live.html",
            "live",
            models=models,
            replicas=replicas,
            served=served,
            alerts=services.telemetry.alerts.state_out(),
        )

    @get("/data/live", name="console_live_data")
    async def live_data(self, services: ServicesDep, user: UserDep, since: float = 0.0) -> Any:
        """Columns for the plots: times and one array per series ("tokens_per_s|model":
        its local engine's figures plus those of its answers from replicas; in router mode
        also "replica_tokens_per_s|replica url", ...)."""
        require_admin(user)
        return services.telemetry.ring.series(since)

    @get("/data/alerts")
    async def alerts_data(self, services: ServicesDep, user: UserDep) -> Any:
        """The alerts firing now and the recent changes, each in Alertmanager's shape."""
        require_admin(user)
        return services.telemetry.alerts.state_out()

        # -- traces ----------------------------------------------------------------------------

    @get("/traces", name="console_traces")
    async def traces(
        self, request: AnyRequest, services: ServicesDep, user: UserDep
    ) -> Response[str]:
        require_admin(user)
        turns = services.telemetry.tracing.buffer.turns(50)
        return page(
            request,
            "console_traces.html",
            "traces",
            turns=turns,
            enabled=services.telemetry.enabled,
            otlp=bool(services.settings.otlp_endpoint),
        )

    @get("/data/traces", name="console_traces_data")
    async def traces_data(self, services: ServicesDep, user: UserDep) -> Any:
        require_admin(user)
        return {"turns": services.telemetry.tracing.buffer.turns(50)}

    @get("/traces/{trace_id:str}", name="console_trace")
    async def trace(
        self, request: AnyRequest, services: ServicesDep, user: UserDep, trace_id: str
    ) -> Response[Any]:
        require_admin(user)
        spans = services.telemetry.tracing.buffer.spans(trace_id)
        if not spans:
            raise NotFoundException("that trace is no longer kept")
        if "application/json" in request.headers.get("accept", ""):
            return Response({"trace_id": trace_id, "spans": [s.as_dict() for s in spans]})
        total = max(s.start_ms + s.duration_ms for s in spans) or 1.0
        depth: dict[str, int] = {}
        for s in spans:
            depth[s.span_id] = depth.get(s.parent_id or "", -1) + 1
        return page(
            request,
            "console_trace.html",
            "traces",
            trace_id=trace_id,
            spans=spans,
            total=total,
            depth=depth,
        )

    # -- people ----------------------------------------------------------------------------

    @get("/people", name="console_people")
    async def people(
        self, request: AnyRequest, services: ServicesDep, user: UserDep
    ) -> Response[str]:
        require_admin(user)
        users = await People(services.accounts, user).list()
        report = await services.accounts.usage(None, None)
        totals = {u["user"]: u for u in report["users"]}
        return page(
            request,
            "console_people.html",
            "people",
            users=users,
            totals=totals,
            tiers=tiers(services),
            methods=await services.accounts.sign_ins.methods(),
            provider=services.settings.oidc_display_name,
        )

    @get("/people/{user_id:str}", name="console_person")
    async def person(
        self, request: AnyRequest, services: ServicesDep, user: UserDep, user_id: str
    ) -> Response[str]:
        require_admin(user)
        return await person_page(request, services, user, user_id)

    @get("/data/usage/{user_id:str}", name="console_usage_data")
    async def usage_data(
        self, services: ServicesDep, user: UserDep, user_id: str, days: int = 30
    ) -> Any:
        """Requests and tokens per day for one user (the person page's plot)."""
        require_admin(user)
        people = People(services.accounts, user)
        try:
            target = await people.get(user_id)
        except LookupError as exc:
            raise NotFoundException("no such user") from exc
        return await people.usage_by_day(target, max(1, min(days, 366)))

    # -- models and the audit log ------------------------------------------------------------

    @get("/models", name="console_models")
    async def models(
        self, request: AnyRequest, services: ServicesDep, user: UserDep
    ) -> Response[str]:
        require_admin(user)
        admin = model_admin(services)
        return page(
            request,
            "console_models.html",
            "models",
            models=await admin.models(),
            tier_defaults=admin.tier_defaults(),
            memory=await services.memory(),
            feedback=await services.chat.feedback_tallies(),
        )

    @get("/audit", name="console_audit")
    async def audit(
        self,
        request: AnyRequest,
        services: ServicesDep,
        user: UserDep,
        action: str | None = None,
    ) -> Response[str]:
        require_admin(user)
        entries = await services.accounts.audit_log(AUDIT_PAGE, action=action or None)
        return page(
            request,
            "console_audit.html",
            "audit",
            entries=[entry_out(e) for e in entries],
            action=action or "",
        )
