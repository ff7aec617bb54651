"""Per-replica metrics of the fleet, in the app's registry beside the engine's.

The `replica` label is the replica's URL (or "local", this front's own engines): a value
the admin configured (a small, bounded set), never anything a user sent. Gauges are read
from the fleet when scraped, so a replica that is removed stops being reported; a front
without remote replicas reports none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from chatbox.cluster.local import LOCAL


class Member(Protocol):
    """What the metrics read of a fleet member (`fleet.Member`, which imports this module)."""

    source: str

    @property
    def url(self) -> str: ...

    @property
    def available(self) -> bool: ...

    def view(self) -> dict[str, Any]: ...


STATES = ("healthy", "draining", "down", "ejected", "unknown")


class ReplicaGauges(Collector):
    """Load and state of each replica now: running, queued, slots, up, state."""

    def __init__(self, members: Callable[[], Iterable[Member]]) -> None:
        self.members = members

    def describe(self) -> Iterator[Metric]:
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        running, queued, slots, up, state = families = self._families()
        members = list(self.members())
        if all(m.source == LOCAL for m in members):  # no fleet to speak of
            members = []
        for member in members:
            view = member.view()
            url = member.url
            running.add_metric([url], view["running"])
            queued.add_metric([url], view["queued"])
            slots.add_metric([url], view["slots"])
            up.add_metric([url], 1.0 if member.available else 0.0)
            for name in STATES:
                state.add_metric([url, name], 1.0 if view["state"] == name else 0.0)
        return iter(families)

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily(
                "chatbox_replica_running",
                "Answers streaming from each replica (up to its slots)",
                labels=["replica"],
            ),
            GaugeMetricFamily(
                "chatbox_replica_queued",
                "Answers sent to each replica past its slots (waiting there)",
                labels=["replica"],
            ),
            GaugeMetricFamily(
                "chatbox_replica_slots", "Parallel answers each replica runs", labels=["replica"]
            ),
            GaugeMetricFamily(
                "chatbox_replica_up",
                "1 while the replica takes new answers (healthy, not draining), else 0",
                labels=["replica"],
            ),
            GaugeMetricFamily(
                "chatbox_replica_state",
                "1 for each replica's current state (healthy, draining, down, ejected, unknown)",
                labels=["replica", "state"],
            ),
        ]


class ReplicaCounters:
    """What each replica did: answers finished there and tokens streamed from it."""

    def __init__(self, registry: CollectorRegistry, members: Callable[[], Iterable[Member]]):
        self.answers = Counter(
            "chatbox_replica_answers",
            "Answers a replica finished",
            ["replica"],
            registry=registry,
        )
        self.tokens = Counter(
            "chatbox_replica_generated_tokens",
            "Tokens streamed from a replica to the front",
            ["replica"],
            registry=registry,
        )
        registry.register(ReplicaGauges(members))
