"""Eval runs and canary verdicts as Prometheus gauges, from figures the services hand over
(plain dicts: this package imports no other of chatbox's)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

VERDICTS = ("collecting", "continue", "ready", "hold", "rollback")
STATES = ("running", "held", "promoted", "rolled_back")


class VerdictGauges(Collector):
    """The newest eval run per model and suite; each canary's verdict, state and metrics."""

    def __init__(self) -> None:
        self.evals: list[Mapping[str, Any]] = []
        self.eval_counts: dict[tuple[str, str], int] = {}
        self.canaries: list[Mapping[str, Any]] = []

    def update_evals(
        self, latest: Sequence[Mapping[str, Any]], counts: Mapping[tuple[str, str], int]
    ) -> None:
        self.evals = list(latest)
        self.eval_counts = dict(counts)

    def update_canaries(self, canaries: Sequence[Mapping[str, Any]]) -> None:
        self.canaries = list(canaries)

    def collect(self) -> Iterator[Metric]:
        score = GaugeMetricFamily(
            "chatbox_eval_score",
            "Mean case score (0..1) of the newest eval run, by model and suite",
            labels=("model", "suite"),
        )
        passed = GaugeMetricFamily(
            "chatbox_eval_passed_ratio",
            "Share of cases passed in the newest eval run, by model and suite",
            labels=("model", "suite"),
        )
        runs = GaugeMetricFamily(
            "chatbox_eval_runs", "Eval runs stored, by model and suite", labels=("model", "suite")
        )
        for r in self.evals:
            labels = [str(r["model"]), str(r["suite"])]
            score.add_metric(labels, float(r["score"] or 0.0))
            passed.add_metric(labels, r["passed"] / r["cases"] if r["cases"] else 0.0)
        for (model, suite), n in self.eval_counts.items():
            runs.add_metric([model, suite], n)
        yield score
        yield passed
        yield runs
        verdict = GaugeMetricFamily(
            "chatbox_canary_verdict",
            "1 for each canary arm's current verdict (collecting, continue, ready, hold, rollback)",
            labels=("tier", "arm", "verdict"),
        )
        state = GaugeMetricFamily(
            "chatbox_canary_state",
            "1 for each canary arm's state (running, held, promoted, rolled_back)",
            labels=("tier", "arm", "state"),
        )
        worse = GaugeMetricFamily(
            "chatbox_canary_worsening",
            "Canary minus baseline in the worse direction (log ratio for ttft and tokens_per_s,"
            " else the difference), by metric; bound: estimate, low, high",
            labels=("arm", "metric", "bound"),
        )
        samples = GaugeMetricFamily(
            "chatbox_canary_samples",
            "Samples behind each canary metric, by side (canary, baseline)",
            labels=("arm", "metric", "side"),
        )
        for c in self.canaries:
            tier, arm = str(c["tier"]), str(c["arm"])
            for s in STATES:
                state.add_metric([tier, arm, s], float(c["state"] == s))
            v = c.get("verdict")
            if not v:
                continue
            for name in VERDICTS:
                verdict.add_metric([tier, arm, name], float(v["verdict"] == name))
            for m in v.get("metrics", []):
                low, high = m["interval"]
                for bound, value in (("estimate", m["worsening"]), ("low", low), ("high", high)):
                    worse.add_metric([arm, m["metric"], bound], float(value))
                samples.add_metric([arm, m["metric"], "canary"], m["arm"]["n"])
                samples.add_metric([arm, m["metric"], "baseline"], m["baseline"]["n"])
        yield verdict
        yield state
        yield worse
        yield samples
