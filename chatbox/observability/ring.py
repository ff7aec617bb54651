"""A small in-process history of the metrics the console plots (no Prometheus needed).

Every `interval_s` the registry is read once; rates and percentiles are computed against
the samples of the last `window_s` (in the time the samples are stamped with, a replay's
clock included) and appended as one row, kept for `history_s`.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any

from prometheus_client import CollectorRegistry

Snapshot = dict[tuple[str, tuple[tuple[str, str], ...]], float]
# A model's figures come from this process's engine and, in router mode, from the front's
# record of answers that remote replicas served: the same families under two prefixes (an
# answer is in one of them only), added up per model.
_SOURCES = ("chatbox_engine_", "chatbox_remote_")
# (plot series, metric after the prefix) pairs; `{model}` series are per label "model"
_GAUGES = {
    "queue_depth": "queue_depth",
    "running": "running_sequences",
    "kv_cells_used": "kv_cells_used",
    "kv_cells_total": "kv_cells_total",
}
# per replica (router mode): `{replica}` series are per label value of "replica"
_REPLICA_GAUGES = {
    "replica_load_running": "chatbox_replica_running",
    "replica_load_queued": "chatbox_replica_queued",
    "replica_up": "chatbox_replica_up",
}
_REPLICA_RATES = {
    "replica_tokens_per_s": "chatbox_replica_generated_tokens_total",
    "replica_answers_per_s": "chatbox_replica_answers_total",
}
# counted over the window (the last minute): rare events, clearer as counts than as rates
_REPLICA_COUNTS = {
    "replica_faults_failovers": "chatbox_replica_failovers_total",
    "replica_faults_ejections": "chatbox_replica_ejections_total",
}
# The answer caches' lookups: a hit rate per cache over the window.
_ANSWER_CACHES = {
    "exact": "chatbox_answer_cache_lookups_total",
    "semantic": "chatbox_semantic_cache_lookups_total",
}
_TTFT = "time_to_first_token_seconds"
_TPOT = "time_per_output_token_seconds"
_OUTCOMES = {f"{p}requests_total" for p in _SOURCES}


def snapshot(registry: CollectorRegistry) -> Snapshot:
    """Every sample of the registry now, keyed by (sample name, sorted labels)."""
    out: Snapshot = {}
    for family in registry.collect():
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) buckets."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


class MetricRing:
    """Rows of derived series over the last hour, read by the console's live plots."""

    def __init__(
        self,
        registry: CollectorRegistry | None,
        interval_s: float = 5.0,
        history_s: float = 3600.0,
        window_s: float = 60.0,
    ) -> None:
        self.registry = registry
        self.interval_s = interval_s
        self.rows: deque[tuple[float, dict[str, float]]] = deque(
            maxlen=max(2, int(history_s / interval_s))
        )
        self.window_s = window_s
        self._snaps: deque[tuple[float, Snapshot]] = deque()  # the window's, by their time

    def sample(self, now: float | None = None) -> dict[str, float]:
        """Read the registry and append one row (also returned)."""
        if self.registry is None:
            return {}
        now = time.time() if now is None else now
        snap = snapshot(self.registry)
        # The window is in the sampling clock's seconds: its oldest snapshot is the last one
        # at or before `now - window_s` (the previous one when samples are further apart).
        while len(self._snaps) > 1 and self._snaps[1][0] <= now - self.window_s:
            self._snaps.popleft()
        prev = self._snaps[-1] if self._snaps else None
        oldest = self._snaps[0] if self._snaps else None
        self._snaps.append((now, snap))
        row = self._derive(now, snap, prev, oldest)
        self.rows.append((now, row))
        return row

    def _derive(
        self,
        now: float,
        snap: Snapshot,
        prev: tuple[float, Snapshot] | None,
        oldest: tuple[float, Snapshot] | None,
    ) -> dict[str, float]:
        row: dict[str, float] = {}
        models = {dict(k[1]).get("model") for k in snap if k[0].startswith(_SOURCES)}
        for model in sorted(m for m in models if m):
            lab = (("model", model),)
            for series, metric in _GAUGES.items():
                values = [snap.get((p + metric, lab)) for p in _SOURCES]
                if any(v is not None for v in values):
                    row[f"{series}|{model}"] = sum(v for v in values if v is not None)
            if prev is not None:
                dt = max(1e-6, now - prev[0])
                tokens = _delta(snap, prev[1], "generated_tokens_total", lab)
                row[f"tokens_per_s|{model}"] = tokens / dt
            if oldest is not None:
                base = oldest[1]
                hit = _delta(snap, base, "prefix_cache_hit_tokens_total", lab)
                miss = _delta(snap, base, "prefix_cache_miss_tokens_total", lab)
                if hit + miss > 0:
                    row[f"cache_hit_rate|{model}"] = hit / (hit + miss)
                for name, metric in (("ttft", _TTFT), ("tpot", _TPOT)):
                    buckets = _bucket_deltas(snap, base, metric, model)
                    for q, tag in ((0.5, "p50"), (0.99, "p99")):
                        value = quantile(q, buckets)
                        if value is not None:
                            row[f"{name}_{tag}_s|{model}"] = value
        if prev is not None:
            dt = max(1e-6, now - prev[0])
            for key, value in snap.items():
                name, labels = key
                d = dict(labels)
                if name in _OUTCOMES:
                    outcome = d.get("finish_reason", "")
                elif name == "chatbox_admission_decisions_total" and d.get("decision") in (
                    "rate_limited",
                    "shed",
                ):
                    outcome = d["decision"]
                else:
                    continue
                rate = max(0.0, value - prev[1].get(key, 0.0)) / dt
                row[f"requests_per_s|{outcome}"] = row.get(f"requests_per_s|{outcome}", 0.0) + rate
        if oldest is not None:
            for cache, family in _ANSWER_CACHES.items():
                hit, miss = (
                    max(0.0, snap.get(k, 0.0) - oldest[1].get(k, 0.0))
                    for k in ((family, (("outcome", o),)) for o in ("hit", "miss"))
                )
                if hit + miss > 0:
                    row[f"answer_cache_hit_rate|{cache}"] = hit / (hit + miss)
        row.update(_replica_row(now, snap, prev, oldest))
        return row

    def latest(self) -> tuple[Snapshot | None, Snapshot | None]:
        """The registry at the last sample and at the one before it (None: not taken)."""
        now = self._snaps[-1][1] if self._snaps else None
        before = self._snaps[-2][1] if len(self._snaps) > 1 else None
        return now, before

    def series(self, since: float = 0.0) -> dict[str, Any]:
        """Columns for the plots: {"t": [...], "series": {name: [value or None, ...]}}."""
        rows = [(t, r) for t, r in self.rows if t > since]
        names = sorted({k for _, r in rows for k in r})
        return {
            "interval_s": self.interval_s,
            "t": [round(t, 3) for t, _ in rows],
            "series": {n: [r.get(n) for _, r in rows] for n in names},
        }


def _replica_row(
    now: float,
    snap: Snapshot,
    prev: tuple[float, Snapshot] | None,
    oldest: tuple[float, Snapshot] | None,
) -> dict[str, float]:
    """Each replica's load, up state, tokens and answers per second, and its failovers and
    ejections over the window: series named `<name>|<replica url>`."""
    row: dict[str, float] = {}
    wanted = {metric: name for name, metric in _REPLICA_GAUGES.items()}
    current: set[str] = set()  # the fleet's replicas now (a removed one drops out)
    for (metric, labels), value in snap.items():
        replica = dict(labels).get("replica")
        if replica and metric in wanted:
            row[f"{wanted[metric]}|{replica}"] = value
            current.add(replica)
    for series, metric, base in [
        *((n, m, prev) for n, m in _REPLICA_RATES.items()),
        *((n, m, oldest) for n, m in _REPLICA_COUNTS.items()),
    ]:
        if base is None:
            continue
        per = max(1e-6, now - base[0]) if series in _REPLICA_RATES else 1.0
        totals = dict.fromkeys(current, 0.0)  # a replica with none yet shows 0
        for key, value in snap.items():
            replica = dict(key[1]).get("replica")
            if key[0] == metric and replica in totals:  # summed over the other labels (model)
                totals[replica] = totals.get(replica, 0.0) + max(0.0, value - base[1].get(key, 0.0))
        for replica, total in totals.items():
            row[f"{series}|{replica}"] = total / per
    return row


def _delta(snap: Snapshot, base: Snapshot, name: str, lab: tuple[tuple[str, str], ...]) -> float:
    """The increase of a counter (named after its prefix) over both sources."""
    total = 0.0
    for prefix in _SOURCES:
        key = (prefix + name, lab)
        total += max(0.0, snap.get(key, 0.0) - base.get(key, 0.0))
    return total


def _bucket_deltas(
    snap: Snapshot, base: Snapshot, metric: str, model: str
) -> list[tuple[float, float]]:
    """One model's histogram increase, bucket by bucket over both sources (which share
    their bucket bounds, so a sum per bound is the histogram of all its answers)."""
    out: dict[float, float] = {}
    names = {p + metric + "_bucket" for p in _SOURCES}
    for (name, labels), value in snap.items():
        if name not in names:
            continue
        d = dict(labels)
        if d.get("model") != model:
            continue
        le = float(d["le"])
        out[le] = out.get(le, 0.0) + max(0.0, value - base.get((name, labels), 0.0))
    return list(out.items())
