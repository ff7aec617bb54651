"""Prometheus metrics for engines, registered in a caller-owned CollectorRegistry.

One `EngineMetricFamilies` exists per registry (metric names must be unique there); each
engine gets an `EngineMetrics` view labelled with its model name. Passing no registry gives
a private throwaway registry, so tests and several apps in one process never clash.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

from chatbox.engine.types import EngineStats

# Shared with the front's figures for answers from replicas (cluster), so the console can
# merge the two histograms bucket by bucket
TIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)


class EngineMetricFamilies:
    """The metric families of all engines sharing one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        kw: dict[str, Any] = {"labelnames": ("model",), "registry": registry}
        self.queue_depth = Gauge("chatbox_engine_queue_depth", "Requests waiting for a slot", **kw)
        self.running = Gauge("chatbox_engine_running_sequences", "Sequences being decoded", **kw)
        self.kv_used = Gauge("chatbox_engine_kv_cells_used", "KV cache cells in use", **kw)
        self.kv_total = Gauge("chatbox_engine_kv_cells_total", "KV cache cells in total", **kw)
        self.cached_prefixes = Gauge(
            "chatbox_engine_cached_prefixes", "Idle sequences kept as prefix cache", **kw
        )
        self.cache_hit = Counter(
            "chatbox_engine_prefix_cache_hit_tokens", "Prompt tokens reused from cache", **kw
        )
        self.cache_miss = Counter(
            "chatbox_engine_prefix_cache_miss_tokens", "Prompt tokens that were prefilled", **kw
        )
        self.ttft = Histogram(
            "chatbox_engine_time_to_first_token_seconds",
            "Submit to first sampled token",
            buckets=TIME_BUCKETS,
            **kw,
        )
        self.clocks = TokenClocks()  # generated tokens and time per output token
        registry.register(self.clocks)
        self.draft_tokens = Counter(
            "chatbox_engine_draft_tokens", "Prompt-lookup guesses verified", **kw
        )
        self.draft_accepted = Counter(
            "chatbox_engine_draft_accepted_tokens", "Prompt-lookup guesses accepted", **kw
        )
        self.requests = Counter(
            "chatbox_engine_requests",
            "Finished requests by finish reason",
            labelnames=("model", "finish_reason"),
            registry=registry,
        )


_families: weakref.WeakKeyDictionary[CollectorRegistry, EngineMetricFamilies] = (
    weakref.WeakKeyDictionary()
)
_lock = threading.Lock()


def families_for(registry: CollectorRegistry) -> EngineMetricFamilies:
    with _lock:
        fam = _families.get(registry)
        if fam is None:
            fam = EngineMetricFamilies(registry)
            _families[registry] = fam
        return fam


class EngineMetrics:
    """One model's labelled metrics; methods are cheap and thread-safe."""

    def __init__(self, model: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        f = families_for(self.registry)
        self.model = model
        self._f = f
        self.queue_depth = f.queue_depth.labels(model=model)
        self.running = f.running.labels(model=model)
        self.kv_used = f.kv_used.labels(model=model)
        self.kv_total = f.kv_total.labels(model=model)
        self.cached_prefixes = f.cached_prefixes.labels(model=model)
        self.cache_hit = f.cache_hit.labels(model=model)
        self.cache_miss = f.cache_miss.labels(model=model)
        self.ttft = f.ttft.labels(model=model)
        self.clock = f.clocks.clock(model)  # per token: the decode thread's alone
        self.draft_tokens = f.draft_tokens.labels(model=model)
        self.draft_accepted = f.draft_accepted.labels(model=model)

    def publish(self, stats: EngineStats) -> None:
        """Set the gauges from the engine's stats."""
        self.queue_depth.set(stats.queue_depth)
        self.running.set(stats.running)
        self.kv_used.set(stats.kv_cells_used)
        self.kv_total.set(stats.kv_cells_total)
        self.cached_prefixes.set(stats.cached_prefixes)

    def finished(self, reason: str) -> None:
        self._f.requests.labels(model=self.model, finish_reason=reason).inc()

    def remove(self) -> None:
        """Drop this model's gauges (it was unloaded); counters keep their history."""
        for gauge in (
            self._f.queue_depth,
            self._f.running,
            self._f.kv_used,
            self._f.kv_total,
            self._f.cached_prefixes,
        ):
            with contextlib.suppress(KeyError):
                gauge.remove(self.model)


class TokenClock:
    """One model's per-token figures, written by its decode thread alone: generated tokens
    and the time between a stream's sampled tokens, exported at scrape time (TokenClocks).

    A prometheus_client Histogram.observe takes two locks (the sum and the bucket), ~20 us of
    the decode thread a token on caches the weights just streamed through; this is a bisect
    and two additions.
    """

    __slots__ = ("tokens", "tpot_counts", "tpot_sum")

    def __init__(self) -> None:
        self.tokens = 0
        self.tpot_counts = [0] * (len(TPOT_BUCKETS) + 1)  # the last one is +Inf
        self.tpot_sum = 0.0

    def tpot(self, seconds: float) -> None:
        self.tpot_counts[bisect_left(TPOT_BUCKETS, seconds)] += 1  # bucket le >= seconds
        self.tpot_sum += seconds


class TokenClocks:
    """The collector of every model's TokenClock in one registry (a model unloaded and
    loaded again keeps its clock: counters never go back)."""

    def __init__(self) -> None:
        self._clocks: dict[str, TokenClock] = {}

    def clock(self, model: str) -> TokenClock:
        return self._clocks.setdefault(model, TokenClock())

    def describe(self) -> Iterator[Metric]:
        yield from self._families({})

    def collect(self) -> Iterator[Metric]:
        yield from self._families(dict(self._clocks))

    @staticmethod
    def _families(clocks: dict[str, TokenClock]) -> Iterator[Metric]:
        tokens = CounterMetricFamily(
            "chatbox_engine_generated_tokens", "Completion tokens generated", labels=["model"]
        )
        tpot = HistogramMetricFamily(
            "chatbox_engine_time_per_output_token_seconds",
            "Time between sampled tokens of one stream",
            labels=["model"],
        )
        for model, clock in clocks.items():
            tokens.add_metric([model], clock.tokens)
            counts, total, buckets = list(clock.tpot_counts), 0, []
            for bound, n in zip((*TPOT_BUCKETS, float("inf")), counts, strict=True):
                total += n
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), total))
            tpot.add_metric([model], buckets, clock.tpot_sum)
        yield tokens
        yield tpot
