"""ClusterModels: the chat layer's model provider over the local engines and the fleet.

A model some replica holds is served by the fleet; where this front keeps a local engine
for it too, that engine is one more member of the fleet's ring (named "local"), so affinity,
spill and admission's capacity cover it. Any other model is served by the local engine as
before. With no replicas this is exactly the one-process appliance.
"""

from __future__ import annotations

from chatbox.cluster.fleet import Fleet
from chatbox.cluster.local import LocalClient, LocalProvider
from chatbox.cluster.remote import RemoteEngine
from chatbox.engine.pool import EnginePool
from chatbox.engine.types import Engine, EngineStats


class ClusterModels:
    def __init__(self, local: LocalProvider, fleet: Fleet, use_local: bool = True) -> None:
        self.local = local
        self.fleet = fleet
        self.use_local = use_local
        self._remote: dict[str, RemoteEngine] = {}
        if use_local:
            client = LocalClient(local)
            fleet.add_local(client, client.snapshot())

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
                remote = self._remote[name] = RemoteEngine(self.fleet, name)
            return remote
        return await self.local.engine(name)

    def holds_kv(self, name: str) -> bool:
        # A remote model's replicas may hold KV while all of them drain or are ejected
        # (then `stats` is None: none takes new work); the erasure asks each that answers.
        return name in self.fleet.models() or self.local.holds_kv(name)

    def stats(self, name: str) -> EngineStats | None:
        if name in self.fleet.models():
            return self.fleet.stats(name)
        return self.local.stats(name)

    def state(self, name: str) -> str:
        """ "loaded", "loading", "failed: <why>", "not loaded" or, for a model replicas
        serve, "no healthy replica"."""
        if name in self.fleet.models() or not self.use_local:
            return "loaded" if self.fleet.stats(name) is not None else "no healthy replica"
        return self.pool.state(name)

    def waiting(self, name: str) -> int:
        """Sends waiting for this model to load here (0 for a remote one)."""
        return 0 if name in self.fleet.models() else self.pool.waiting(name)

    def default_loaded(self) -> bool:
        try:
            name = self.default()
        except Exception:
            return False
        if name in self.fleet.models():
            return self.fleet.stats(name) is not None
        return self.local.default_loaded()
