"""Pre-warming on the replicas: models a chatbox replica has installed but not loaded are
loaded there on the pre-warmer's request (the replica protocol's `/load`, behind the
replica's secret), and unloaded again once idle, only where it asked for them: a model a
replica was started with is never unloaded by the front."""

from __future__ import annotations

import logging

from chatbox.cluster.clients import ChatboxClient, ReplicaFailed
from chatbox.cluster.fleet import Fleet, Member

log = logging.getLogger("chatbox.cluster")
LOAD_TIMEOUT_S = 300.0  # a large GGUF read from a cold disk


class ReplicaWarming:
    """What the pre-warmer may load and unload on the fleet's chatbox replicas."""

    def __init__(self, fleet: Fleet, timeout_s: float = LOAD_TIMEOUT_S) -> None:
        self.fleet = fleet
        self.timeout_s = timeout_s
        self.warmed: dict[str, set[str]] = {}  # model -> replica URLs it was loaded on here

    def _replicas(self) -> list[Member]:
        return [
            m
            for m in self.fleet.members.values()
            if isinstance(m.client, ChatboxClient) and m.available and m.health is not None
        ]

    def installed(self) -> set[str]:
        """Models some available chatbox replica has installed (loaded or not)."""
        out: set[str] = set()
        for m in self._replicas():
            assert m.health is not None
            out.update(m.health.installed)
            out.update(m.health.models)
        return out

    def served(self) -> set[str]:
        """Models some replica serves now."""
        return self.fleet.models()

    def kept(self) -> set[str]:
        """Models replicas serve that the front did not load there: never unloaded by it."""
        return {
            model
            for m in self.fleet.members.values()
            if m.health is not None and isinstance(m.client, ChatboxClient)
            for model in m.health.models
            if m.url not in self.warmed.get(model, set())
        }

    async def load(self, model: str) -> str | None:
        """Ask the least busy available replica that has the model installed, and serves it
        not yet, to load it; the URL asked, or None when no replica could."""
        ready = [m for m in self._replicas() if m.serves(model)]
        if ready:
            return ready[0].url
        able = [m for m in self._replicas() if m.health is not None and model in m.health.installed]
        for member in sorted(able, key=lambda m: m.running()):
            assert isinstance(member.client, ChatboxClient)
            try:
                await member.client.load(model, self.timeout_s)
            except ReplicaFailed as exc:
                log.warning("replica %s did not load %s: %s", member.url, model, exc)
                continue
            self.warmed.setdefault(model, set()).add(member.url)
            await self.fleet.check(member)  # routing sees the model at once
            return member.url
        return None

    async def unload(self, model: str) -> list[str]:
        """Unload the model where the front loaded it; the URLs that unloaded it."""
        done = []
        for url in sorted(self.warmed.get(model, set())):
            member = self.fleet.members.get(url)
            if member is None or not isinstance(member.client, ChatboxClient):
                self.warmed[model].discard(url)
                continue
            try:
                await member.client.unload(model, self.timeout_s)
            except ReplicaFailed as exc:
                log.warning("replica %s did not unload %s: %s", url, model, exc)
                continue
            self.warmed[model].discard(url)
            done.append(url)
            await self.fleet.check(member)
        return done
