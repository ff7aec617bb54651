"""The fleet: replicas, their live health and load, affinity, ejection and drain.

Routing is rendezvous (highest-random-weight) hashing of the affinity key over the healthy
replicas of a model, so a conversation's turns land where its prefix cache is warm and
adding or removing a replica moves only that replica's share. A replica past its queue
limit spills the request to the next in hash order. Health: an active check every few
seconds, passive ejection on failures with exponential backoff, re-admission by a check.

With several fronts on one database, a replica's load is this front's answers there plus the
other fronts' (a chatbox replica's own running and queued counts, read with each health
check; for an OpenAI-kind one, the counts the fronts publish in the store), and keys placed
off their hash order are noted in the store, so another front sends them to the same replica.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter

from chatbox.cluster.clients import Client, Health, ReplicaFailed, client_for
from chatbox.cluster.local import LOCAL
from chatbox.cluster.metrics import ReplicaCounters
from chatbox.cluster.model_metrics import RemoteModelMetrics
from chatbox.cluster.protocol import ReplicaSpec
from chatbox.engine.types import EngineStats

log = logging.getLogger("chatbox.cluster")
BACKOFF_MAX_S = 60.0
# How far past its share of the load a replica still takes a new conversation. 0: none, so a
# burst of new conversations splits evenly (8 answers on 2 replicas split 4/4, since the
# fleet finishes only when its busiest replica does). Nothing is lost to affinity: a new key
# has nothing cached anywhere, and where its answer went is remembered, so its later turns
# follow it.
BALANCE = 0.0
PLACED_MAX = 100_000  # routed keys remembered (the oldest are forgotten: ~10 MB)


class Placements(Protocol):
    """Where routed keys went off their hash order, shared by the fronts (the store)."""

    async def placement(self, key: str) -> str | None: ...

    async def place(self, key: str, url: str) -> None: ...


def weight(key: str, url: str) -> int:
    digest = hashlib.blake2b(f"{key}\0{url}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@dataclass
class Member:
    """One replica as the front sees it now."""

    spec: ReplicaSpec
    client: Client
    source: str  # "flag" (command line / env) or "table" (the database)
    draining: bool = False
    health: Health | None = None
    state: str = "unknown"  # unknown | healthy | down | ejected
    failures: int = 0
    ejected_until: float = 0.0
    last_error: str | None = None
    inflight: dict[str, int] = field(default_factory=dict)  # model -> answers running here
    others: dict[str, int] = field(default_factory=dict)  # model -> other fronts' answers here
    served: int = 0
    cached_tokens: int = 0
    prompt_tokens: int = 0

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def slots(self) -> int:
        return self.health.slots if self.health else max(1, self.spec.slots)

    def serves(self, model: str) -> bool:
        return self.health is not None and model in self.health.models

    @property
    def available(self) -> bool:
        return self.state == "healthy" and not self.draining

    def running(self) -> int:
        return sum(self.inflight.values())

    def load(self, model: str) -> int:
        """Answers running or queued here for the model, from every front."""
        return self.inflight.get(model, 0) + self.others.get(model, 0)

    def view(self) -> dict[str, Any]:
        running = self.running() + sum(self.others.values())
        return {
            "url": self.url,
            "kind": self.spec.kind,
            "source": self.source,
            "state": "draining" if self.draining else self.state,
            "models": sorted(self.health.models) if self.health else list(self.spec.models),
            "slots": self.slots,
            "running": min(running, self.slots),
            "queued": max(0, running - self.slots),
            "served": self.served,
            "prefix_hit_rate": round(self.cached_tokens / self.prompt_tokens, 3)
            if self.prompt_tokens
            else None,
            "last_error": self.last_error,
        }


class Fleet:
    """The replicas of this front; `pick` routes, `lease` counts load, `eject` backs off."""

    def __init__(
        self,
        token: str | None,
        timeout_s: float = 15.0,
        health_s: float = 2.0,
        queue_limit: int = 4,
        metrics: CollectorRegistry | None = None,
    ) -> None:
        self.token = token
        self.timeout_s = timeout_s
        self.health_s = health_s
        self.queue_limit = queue_limit
        self.members: dict[str, Member] = {}
        # routed keys -> the replica their last answer went to (where their KV is)
        self._placed: OrderedDict[str, str] = OrderedDict()
        self.placements: Placements | None = None  # shared with other fronts (PostgreSQL)
        self._writes: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None
        registry = metrics if metrics is not None else CollectorRegistry()
        self.spills = Counter(
            "chatbox_replica_spills",
            "Requests sent past their preferred replica",
            ["model"],
            registry=registry,
        )
        self.failovers = Counter(
            "chatbox_replica_failovers",
            "Answers moved to another replica mid-way, by the replica they left",
            ["model", "replica"],
            registry=registry,
        )
        self.ejections = Counter(
            "chatbox_replica_ejections",
            "Replicas ejected after a failure",
            ["replica"],
            registry=registry,
        )
        self.per_replica = ReplicaCounters(registry, lambda: self.members.values())
        # per model, for answers from remote replicas (the console's per-model plots)
        self.per_model = RemoteModelMetrics(registry, lambda: self.members.values())

    # -- membership --------------------------------------------------------------------
    def add(self, spec: ReplicaSpec, source: str, draining: bool = False) -> Member:
        if spec.secret is None and self.token:
            spec = ReplicaSpec(spec.url, spec.kind, spec.slots, spec.models, self.token)
        old = self.members.get(spec.url)
        member = Member(spec, client_for(spec, self.timeout_s), source, draining)
        if old is not None:
            member.inflight = old.inflight  # running answers keep being counted
            member.others = old.others
            asyncio.get_running_loop().create_task(old.client.close())
        self.members[spec.url] = member
        return member

    async def remove(self, url: str) -> bool:
        member = self.members.pop(url, None)
        if member is None:
            return False
        await member.client.close()
        return True

    def add_local(self, client: Client, health: Health) -> Member:
        """This front's own engines as the member named "local" (see `cluster.local`)."""
        member = Member(ReplicaSpec(LOCAL, LOCAL, health.slots), client, LOCAL)
        member.health, member.state = health, "healthy"
        self.members[LOCAL] = member
        return member

    def models(self) -> set[str]:
        """Models some remote replica reported holding (whatever its state now)."""
        held = [m.health.models for m in self.members.values() if m.health and m.source != LOCAL]
        return {model for models in held for model in models}

    # -- routing -------------------------------------------------------------------------
    def order(self, model: str, key: str) -> list[Member]:
        """Available replicas of the model, in this key's rendezvous order."""
        able = [m for m in self.members.values() if m.available and m.serves(model)]
        return sorted(able, key=lambda m: weight(key, m.url), reverse=True)

    def pick(self, model: str, key: str, exclude: set[str]) -> Member | None:
        """Where key's next answer goes.

        A key seen before goes where its last answer went (its KV is there) unless that
        replica is past its queue limit; then to the next with room (a spill: a cold
        prefill beats a long wait). A new key goes to the first replica in its hash order
        that is under its queue limit and under its share of the load: consistent hashing
        with bounded loads, a replica taking new conversations up to (1 + BALANCE) x its
        slots' share of the model's running answers, so a burst of new conversations spreads
        over the fleet instead of piling onto whichever replica most of them hash to.
        """
        ranked = self.order(model, key)
        order = [m for m in ranked if m.url not in exclude]
        if not order:
            return None
        placed = self._placed.get(key) if key else None
        if placed is not None:
            order.sort(key=lambda m: m.url != placed)  # stable: the rest keep hash order
        else:
            total = sum(m.load(model) for m in order) + 1
            slots = sum(m.slots for m in order)
            for member in order:
                share = math.ceil((1 + BALANCE) * total * member.slots / slots)
                if self._room(member, model) and member.load(model) < share:
                    self._place(key, member, member is not order[0], model, ranked[0])
                    return member
        # Its replica (or, for a new key, every one) is past its share: the first with room.
        for member in order:
            if self._room(member, model):
                self._place(key, member, member is not order[0], model, ranked[0])
                return member
        # All past their limit: the least queued (a replica's own full queue answers 429)
        return min(order, key=lambda m: m.load(model) - m.slots)

    def _room(self, member: Member, model: str) -> bool:
        return member.load(model) < member.slots + self.queue_limit

    def _place(self, key: str, member: Member, spilled: bool, model: str, first: Member) -> None:
        """Remember where a key's answer went (the LRU of keys forgets the oldest); one
        placed off its hash order (or moved back to it) is also noted for the other fronts."""
        if spilled:
            self.spills.labels(model).inc()
        if not key:
            return
        before = self._placed.get(key)
        self._placed[key] = member.url
        self._placed.move_to_end(key)
        while len(self._placed) > PLACED_MAX:
            self._placed.popitem(last=False)
        shared = member is not first or (before is not None and before != member.url)
        if shared and self.placements is not None and member.source != LOCAL:
            task = asyncio.get_running_loop().create_task(self._share(key, member.url))
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)

    async def _share(self, key: str, url: str) -> None:
        try:
            assert self.placements is not None
            await self.placements.place(key, url)
        except Exception as exc:  # routing goes on; other fronts use the hash order
            log.warning("could not share where %s was placed: %s", key[:12], exc)

    async def recall(self, key: str) -> None:
        """A key this front has not routed: where another front placed it, if anywhere."""
        if not key or key in self._placed or self.placements is None:
            return
        try:
            url = await self.placements.placement(key)
        except Exception as exc:  # the hash order is a fine fallback
            log.warning("could not read where %s was placed: %s", key[:12], exc)
            return
        if url is not None and url in self.members and key not in self._placed:
            self._placed[key] = url

    @contextmanager
    def lease(self, member: Member, model: str) -> Iterator[None]:
        member.inflight[model] = member.inflight.get(model, 0) + 1
        try:
            yield
        finally:
            member.inflight[model] -= 1

    def eject(self, member: Member, error: str) -> None:
        """Passive ejection: out of rotation for a backoff that doubles with each failure."""
        member.failures += 1
        member.last_error = error
        member.state = "ejected"
        member.ejected_until = time.monotonic() + min(BACKOFF_MAX_S, 2.0 ** (member.failures - 1))
        self.ejections.labels(member.url).inc()
        log.warning("replica %s ejected: %s", member.url, error)

    def succeeded(self, member: Member, prompt_tokens: int, cached_tokens: int) -> None:
        member.failures = 0
        member.served += 1
        self.per_replica.answers.labels(member.url).inc()
        member.prompt_tokens += prompt_tokens
        member.cached_tokens += cached_tokens

    def stats(self, model: str) -> EngineStats | None:
        """The model's combined load and capacity over its available replicas (the local
        engine among them where this front keeps one), for admission: each replica's slots
        (its engine's, per model) and the answers every front has running or queued there.
        None while no replica can take the model."""
        members = [m for m in self.members.values() if m.available and m.serves(model)]
        if not members:
            return None
        running = queued = slots = 0
        for m in members:
            here = m.load(model)
            running += min(here, m.slots)
            queued += max(0, here - m.slots)
            slots += m.slots
        return EngineStats(queue_depth=queued, running=running, slots_total=slots)

    def n_ctx(self, model: str) -> int:
        sizes = [
            m.health.models[model]
            for m in self.members.values()
            if m.health and m.health.models.get(model)
        ]
        return min(sizes) if sizes else 0

    # -- health --------------------------------------------------------------------------
    async def check(self, member: Member) -> None:
        if member.state == "ejected" and time.monotonic() < member.ejected_until:
            return
        if member.source == LOCAL:  # no network between: healthy once its backoff is over
            member.health, member.state = await member.client.health(), "healthy"
            return
        before = dict(member.inflight)
        try:
            async with asyncio.timeout(self.timeout_s):
                member.health = await member.client.health()
        except (ReplicaFailed, TimeoutError) as exc:
            error = str(exc) or "health check timed out"
            if member.state != "down" or member.last_error != error:
                log.warning("replica %s is down: %s", member.url, error)
            member.state, member.last_error = "down", error
            return
        if member.state != "healthy":
            log.info("replica %s is healthy (%s)", member.url, ", ".join(member.health.models))
        member.state = "healthy"
        if member.health.stats:  # a chatbox replica counts every front's answers
            member.others = {
                model: max(
                    0,
                    s.running
                    + s.queue_depth
                    - max(before.get(model, 0), member.inflight.get(model, 0)),
                )
                for model, s in member.health.stats.items()
            }

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(m) for m in list(self.members.values())))

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            try:
                await self.check_all()
            except Exception:  # one bad check must not end health checking
                log.exception("replica health check failed")
            await asyncio.sleep(self.health_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await asyncio.gather(*self._writes, return_exceptions=True)
        for member in list(self.members.values()):
            await member.client.close()
