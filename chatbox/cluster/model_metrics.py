"""Per-model figures of the answers this front serves from remote replicas, measured here.

They mirror the engine's `chatbox_engine_*` families as `chatbox_remote_*` (same names after
the prefix, same labels, same histogram buckets), so a dashboard or the console's ring adds
the two per model. An answer the fleet gives to this front's own engine (the member named
"local") is counted by that engine alone, never here: nothing is counted twice.

Times are as the front sees them: time to first token from the submit here (queueing, the
network and the replica's prefill included), time per output token between tokens as they
arrive. The only label is the model (and the finish reason for outcomes): both small sets
the admin configured or the code defines.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from chatbox.cluster.clients import Health
from chatbox.cluster.local import LOCAL
from chatbox.engine.metrics import TIME_BUCKETS, TPOT_BUCKETS

PREFIX = "chatbox_remote_"


class Holder(Protocol):
    """What the gauges read of a fleet member (`fleet.Member`)."""

    source: str
    state: str
    health: Health | None
    inflight: dict[str, int]

    @property
    def slots(self) -> int: ...


class RemoteModelGauges(Collector):
    """Read when scraped: answers running and queued at replicas per model (as this front
    leased them), and the KV cells chatbox replicas report for the model in their health."""

    def __init__(self, members: Callable[[], Iterable[Holder]]) -> None:
        self.members = members

    def describe(self) -> Iterator[Metric]:
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        running, queued, kv_used, kv_total = families = self._families()
        load: dict[str, list[int]] = {}
        kv: dict[str, list[int]] = {}
        for m in self.members():
            if m.source == LOCAL:  # the local engine reports its own
                continue
            for model in m.health.models if m.health else ():
                load.setdefault(model, [0, 0])  # a model replicas hold shows 0, not nothing
            for model, here in m.inflight.items():
                row = load.setdefault(model, [0, 0])
                row[0] += min(here, m.slots)
                row[1] += max(0, here - m.slots)
            if m.health is None or m.state != "healthy":  # a stale report is no figure
                continue
            for model, stats in m.health.stats.items():
                if stats.kv_cells_total:  # OpenAI servers report none
                    cells = kv.setdefault(model, [0, 0])
                    cells[0] += stats.kv_cells_used
                    cells[1] += stats.kv_cells_total
        for model, (run, wait) in sorted(load.items()):
            running.add_metric([model], run)
            queued.add_metric([model], wait)
        for model, (used, total) in sorted(kv.items()):
            kv_used.add_metric([model], used)
            kv_total.add_metric([model], total)
        return iter(families)

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily(
                PREFIX + "running_sequences",
                "Answers streaming from replicas, per model (up to each replica's slots)",
                labels=["model"],
            ),
            GaugeMetricFamily(
                PREFIX + "queue_depth",
                "Answers sent to replicas past their slots (waiting there), per model",
                labels=["model"],
            ),
            GaugeMetricFamily(
                PREFIX + "kv_cells_used",
                "KV cache cells in use for the model, summed over healthy chatbox replicas "
                "(their whole cache: every front's use)",
                labels=["model"],
            ),
            GaugeMetricFamily(
                PREFIX + "kv_cells_total",
                "KV cache cells in total for the model, summed over healthy chatbox replicas",
                labels=["model"],
            ),
        ]


class RemoteModelMetrics:
    """The counters and histograms `RemoteGeneration` records into, and the gauges."""

    def __init__(
        self, registry: CollectorRegistry, members: Callable[[], Iterable[Holder]]
    ) -> None:
        kw: dict[str, Any] = {"labelnames": ("model",), "registry": registry}
        self.ttft = Histogram(
            PREFIX + "time_to_first_token_seconds",
            "Submit at this front to the first token received from a replica",
            buckets=TIME_BUCKETS,
            **kw,
        )
        self.tpot = Histogram(
            PREFIX + "time_per_output_token_seconds",
            "Time between tokens of one answer as this front receives them from replicas",
            buckets=TPOT_BUCKETS,
            **kw,
        )
        self.tokens = Counter(
            PREFIX + "generated_tokens",
            "Completion tokens received from replicas",
            **kw,
        )
        self.cache_hit = Counter(
            PREFIX + "prefix_cache_hit_tokens",
            "Prompt tokens chatbox replicas reused from their cache (as their usage reports)",
            **kw,
        )
        self.cache_miss = Counter(
            PREFIX + "prefix_cache_miss_tokens",
            "Prompt tokens chatbox replicas prefilled (as their usage reports)",
            **kw,
        )
        self.requests = Counter(
            PREFIX + "requests",
            "Answers served from replicas, by finish reason",
            labelnames=("model", "finish_reason"),
            registry=registry,
        )
        registry.register(RemoteModelGauges(members))
