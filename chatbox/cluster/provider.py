"""ClusterModels: the chat layer's model provider over the local engines and the fleet.

A model some replica holds is served by the fleet (the local engine, where this front has
the model too, is the last resort when no replica is left); any other model is served by
the local engine as before. With no replicas this is exactly the one-process appliance.
"""

from __future__ import annotations

from typing import Protocol

from chatbox.cluster.fleet import Fleet
from chatbox.cluster.remote import LocalFallback, RemoteEngine
from chatbox.engine.pool import EnginePool
from chatbox.engine.types import Engine, EngineStats


class LocalProvider(Protocol):
    pool: EnginePool

    def names(self) -> list[str]: ...

    def default(self) -> str: ...

    async def engine(self, name: str) -> Engine: ...

    def stats(self, name: str) -> EngineStats | None: ...

    def default_loaded(self) -> bool: ...


class ClusterModels:
    def __init__(self, local: LocalProvider, fleet: Fleet, use_local: bool = True) -> None:
        self.local = local
        self.fleet = fleet
        self.use_local = use_local
        self._remote: dict[str, RemoteEngine] = {}

    @property
    def pool(self) -> EnginePool:
        return self.local.pool

    def _local_names(self) -> list[str]:
        return self.local.names() if self.use_local else []

    def names(self) -> list[str]:
        local = self._local_names()
        return local + sorted(self.fleet.models() - set(local))

    def default(self) -> str:
        if self.use_local or not self.fleet.models():
            return self.local.default()
        held = self.fleet.models()
        try:
            preferred = self.local.default()
        except Exception:  # no local model at all: the fleet's first
            preferred = ""
        return preferred if preferred in held else sorted(held)[0]

    async def engine(self, name: str) -> Engine:
        # Replicas only: a model is remote even while none holds it (the front starts and
        # answers "no healthy replica" until one is up, rather than failing to start).
        if name in self.fleet.models() or not self.use_local:
            remote = self._remote.get(name)
            if remote is None:
                fallback = self._fallback(name) if name in self._local_names() else None
                remote = self._remote[name] = RemoteEngine(self.fleet, name, fallback)
            return remote
        return await self.local.engine(name)

    def _fallback(self, name: str) -> LocalFallback:
        async def load() -> Engine | None:
            return await self.local.engine(name)

        return load

    def stats(self, name: str) -> EngineStats | None:
        if name in self.fleet.models():
            return self.fleet.stats(name)
        return self.local.stats(name)

    def default_loaded(self) -> bool:
        try:
            name = self.default()
        except Exception:
            return False
        if name in self.fleet.models():
            return self.fleet.stats(name) is not None
        return self.local.default_loaded()
