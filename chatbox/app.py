"""The app factory: `create_app(settings)` wires services, routes, guards and templates.

Everything is built here and nothing at import time. The services are started by the
lifespan and reach handlers only through the dependencies declared below (`Provide`), the
one place that knows where they live.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

from litestar import Litestar
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.routes import HTTPRoute
from litestar.static_files import create_static_files_router
from litestar.template import TemplateConfig
from prometheus_client import CollectorRegistry

from chatbox import __version__
from chatbox.accounts import AccountsService
from chatbox.catalog.registry import ModelRegistry
from chatbox.chat import ChatService
from chatbox.chat.rollout.shadow import counts_as_user_request
from chatbox.chat.teams.shares import Sharing
from chatbox.chat.teams.workspaces import Workspaces
from chatbox.data import DataService
from chatbox.knowledge import Knowledge
from chatbox.observability import Telemetry
from chatbox.observability.alerts import Alerts, disk_fraction
from chatbox.observability.http import telemetry_middleware
from chatbox.services.server import Services
from chatbox.settings import Settings
from chatbox.web.auth import (
    LoginRequired,
    authenticate_first,
    login_required_handler,
    provide_user,
)
from chatbox.web.errors import EXCEPTION_HANDLERS
from chatbox.web.intake import check_request
from chatbox.web.openapi import describe
from chatbox.web.routes import ROUTE_HANDLERS
from chatbox.web.security import security_headers
from chatbox.web.ui.templating import configure_templates

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES_DIR = ROOT / "templates"
STATIC_DIR = ROOT / "static"


class _Running:
    """The services of a started app (set by the lifespan, read by the providers)."""

    services: Services | None = None

    def get(self) -> Services:
        if self.services is None:
            raise RuntimeError("the app has not started")
        return self.services


def create_app(settings: Settings, registry: ModelRegistry | None = None) -> Litestar:
    """Build the whole appliance for these settings."""
    metrics = CollectorRegistry()
    telemetry = Telemetry(
        metrics,
        enabled=settings.telemetry,
        otlp_endpoint=settings.otlp_endpoint,
        keep_traces=settings.keep_traces,
        sample_s=settings.console_sample_s,
        alerts=Alerts(
            webhook_url=settings.alert_webhook_url,
            disk=disk_fraction(settings.data_dir),
            external_url=settings.public_url or f"http://{settings.host}:{settings.port}",
            baselines_path=settings.data_dir / "alert-baselines.json",
        ),
    )
    running = _Running()

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        services = await Services.start(settings, registry, metrics, telemetry)
        running.services = services
        app.state.services = services  # for tests and debugging; handlers use Provide
        try:
            services.start_preload()  # /readyz says ready once the default models are loaded
            yield
        finally:
            running.services = None
            await services.stop()

    def provide_services() -> Services:
        return running.get()

    def provide_chat() -> ChatService:
        return running.get().chat

    def provide_knowledge() -> Knowledge:
        return running.get().knowledge

    def provide_accounts() -> AccountsService:
        return running.get().accounts

    def provide_data_service() -> DataService:
        data = running.get().data
        if data is None:
            raise RuntimeError("the data service has not started")
        return data

    def provide_sharing() -> Sharing:
        sharing = running.get().sharing
        if sharing is None:
            raise RuntimeError("sharing has not started")
        return sharing

    def provide_workspaces() -> Workspaces:
        workspaces = running.get().workspaces
        if workspaces is None:
            raise RuntimeError("workspaces have not started")
        return workspaces

    def provide_settings() -> Settings:
        return settings

    def provide_metrics() -> CollectorRegistry:
        return metrics

    app = Litestar(
        route_handlers=[
            *ROUTE_HANDLERS,
            create_static_files_router(path="/static", directories=[STATIC_DIR]),
        ],
        dependencies={
            "services": Provide(provide_services, sync_to_thread=False),
            "chat": Provide(provide_chat, sync_to_thread=False),
            "knowledge": Provide(provide_knowledge, sync_to_thread=False),
            "accounts": Provide(provide_accounts, sync_to_thread=False),
            "data_service": Provide(provide_data_service, sync_to_thread=False),
            "settings": Provide(provide_settings, sync_to_thread=False),
            "sharing": Provide(provide_sharing, sync_to_thread=False),
            "workspaces": Provide(provide_workspaces, sync_to_thread=False),
            "metrics": Provide(provide_metrics, sync_to_thread=False),
            "user": Provide(provide_user),
        },
        exception_handlers={**EXCEPTION_HANDLERS, LoginRequired: login_required_handler},
        guards=[authenticate_first(provide_accounts, settings)],
        before_request=check_request,
        lifespan=[lifespan],
        before_send=[security_headers],
        template_config=TemplateConfig(
            directory=TEMPLATES_DIR,
            engine=JinjaTemplateEngine,
            engine_callback=partial(configure_templates, cache_dir=settings.cache_dir),
        ),
        openapi_config=OpenAPIConfig(title="chatbox", version=__version__, path="/schema"),
        # The process's logging is chatbox.observability.logs's: litestar's default config
        # would replace it (dictConfig) with its own format and re-enable disabled loggers.
        logging_config=None,
    )
    _allow_every_method(app)
    describe(app)
    app.asgi_handler = _count_user_requests(app.asgi_handler, running)
    if settings.telemetry:
        # Around the router, not per route: requests no route matches are measured too.
        app.asgi_handler = telemetry_middleware(telemetry)(app.asgi_handler)
    return app


def _count_user_requests(handler: Any, running: _Running) -> Any:
    """Wrap the app's handler (outside routing) so that shadow traffic knows, from the moment
    a user's request arrives until its response has been sent, that it must give way."""

    async def counted(scope: Any, receive: Any, send: Any) -> None:
        services = running.services
        shadow = services.shadow if services is not None else None
        if (
            shadow is None
            or scope["type"] != "http"
            or not counts_as_user_request(str(scope.get("method", "GET")), str(scope["path"]))
        ):
            await handler(scope, receive, send)
            return
        intake = shadow.intake
        intake.enter()
        try:
            await handler(scope, receive, send)
        finally:
            intake.leave()

    return counted


def _allow_every_method(app: Litestar) -> None:
    """OPTIONS names every method of its path in `Allow`: Litestar's own OPTIONS handler
    answers for the route it was made with, and a path whose handlers were registered in
    two goes keeps the first route's handler, so it is pointed at the route that serves."""
    for route in app.routes:
        if not isinstance(route, HTTPRoute) or "OPTIONS" not in route.route_handler_map:
            continue
        handler = route.route_handler_map["OPTIONS"][0]
        for cell in getattr(handler.fn, "__closure__", None) or ():
            if isinstance(cell.cell_contents, HTTPRoute):
                cell.cell_contents = route
