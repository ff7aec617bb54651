"""The console's ring adds a model's two sources: its local engine and the front's record
of the answers replicas served (router mode), without counting either twice; it plots the
answer caches' hit rates side by side."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from chatbox.cluster.model_metrics import RemoteModelMetrics
from chatbox.engine.metrics import EngineMetrics
from chatbox.observability.metrics import AppMetrics
from chatbox.observability.ring import MetricRing


def test_a_model_served_here_and_by_replicas_is_one_set_of_series() -> None:
    registry = CollectorRegistry()
    local = EngineMetrics("tiny", registry)
    remote = RemoteModelMetrics(registry, lambda: [])
    ring = MetricRing(registry, interval_s=1.0, window_s=10.0)
    ring.sample(now=100.0)
    local.clock.tokens += 30
    remote.tokens.labels("tiny").inc(20)
    remote.tokens.labels("big").inc(10)  # a model only replicas serve
    for v in (0.02, 0.03):
        local.ttft.observe(v)
    for v in (2.0, 3.0):
        remote.ttft.labels("tiny").observe(v)
    local.cache_hit.inc(10)
    local.cache_miss.inc(30)
    remote.cache_hit.labels("tiny").inc(30)
    remote.cache_miss.labels("tiny").inc(10)
    local.running.set(1)
    local.finished("stop")
    remote.requests.labels("tiny", "stop").inc()
    remote.requests.labels("big", "length").inc()
    row = ring.sample(now=102.0)
    assert row["tokens_per_s|tiny"] == 25.0  # (30 + 20) / 2 s
    assert row["tokens_per_s|big"] == 5.0
    assert row["cache_hit_rate|tiny"] == 0.5
    assert row["running|tiny"] == 1
    # one histogram of all four first tokens: the median between the fast and the slow
    assert 0.03 <= row["ttft_p50_s|tiny"] <= 2.5
    assert row["ttft_p99_s|tiny"] > 2.0
    assert row["requests_per_s|stop"] == 1.0 and row["requests_per_s|length"] == 0.5
    assert "ttft_p50_s|big" not in row  # no answer's first token measured for it


def test_the_answer_caches_hit_rates_are_plotted_side_by_side() -> None:
    registry = CollectorRegistry()
    metrics = AppMetrics(registry)
    ring = MetricRing(registry, interval_s=1.0, window_s=10.0)
    ring.sample(now=100.0)
    metrics.answer_cache.labels("hit").inc(3)
    metrics.answer_cache.labels("miss").inc(1)
    metrics.semantic_cache.labels("hit").inc(1)
    metrics.semantic_cache.labels("miss").inc(3)
    row = ring.sample(now=102.0)
    assert row["answer_cache_hit_rate|exact"] == 0.75
    assert row["answer_cache_hit_rate|semantic"] == 0.25
