"""The app factory: `create_app(settings)` wires services, routes, guards and templates.

Everything is built here and nothing at import time. The services are started by the
lifespan and reach handlers only through the dependencies declared below (`Provide`), the
one place that knows where they live.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from litestar import Litestar
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.static_files import create_static_files_router
from litestar.template import TemplateConfig
from prometheus_client import CollectorRegistry

from chatbox import __version__
from chatbox.accounts import AccountsService
from chatbox.chat import ChatService
from chatbox.engine.registry import ModelRegistry
from chatbox.knowledge import Knowledge
from chatbox.services import Services
from chatbox.settings import Settings
from chatbox.web import ROUTE_HANDLERS
from chatbox.web.auth import LoginRequired, login_required_handler, provide_user
from chatbox.web.errors import EXCEPTION_HANDLERS
from chatbox.web.security import security_headers
from chatbox.web.templating import configure_templates

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
    running = _Running()

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        services = await Services.start(settings, registry, metrics)
        running.services = services
        app.state.services = services  # for tests and debugging; handlers use Provide
        try:
            await services.models.engine(services.models.default())  # load before serving
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

    def provide_settings() -> Settings:
        return settings

    def provide_metrics() -> CollectorRegistry:
        return metrics

    return Litestar(
        route_handlers=[
            *ROUTE_HANDLERS,
            create_static_files_router(path="/static", directories=[STATIC_DIR]),
        ],
        dependencies={
            "services": Provide(provide_services, sync_to_thread=False),
            "chat": Provide(provide_chat, sync_to_thread=False),
            "knowledge": Provide(provide_knowledge, sync_to_thread=False),
            "accounts": Provide(provide_accounts, sync_to_thread=False),
            "settings": Provide(provide_settings, sync_to_thread=False),
            "metrics": Provide(provide_metrics, sync_to_thread=False),
            "user": Provide(provide_user),
        },
        exception_handlers={**EXCEPTION_HANDLERS, LoginRequired: login_required_handler},
        lifespan=[lifespan],
        before_send=[security_headers],
        template_config=TemplateConfig(
            directory=TEMPLATES_DIR, engine=JinjaTemplateEngine, engine_callback=configure_templates
        ),
        openapi_config=OpenAPIConfig(title="chatbox", version=__version__, path="/schema"),
    )
