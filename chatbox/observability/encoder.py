"""The sentence encoder's CPU and its screen as Prometheus counters, read from the embedder's
own figures at each scrape (a plain callable: this package imports no other of chatbox's)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector


class EncoderCounters(Collector):
    """`chatbox_encoder_cpu_seconds_total{lane}` and `chatbox_encoder_screened_total{outcome}`."""

    def __init__(self, usage: Callable[[], Mapping[str, Any]]) -> None:
        self.usage = usage

    def collect(self) -> Iterator[Metric]:
        figures = self.usage()
        cpu = CounterMetricFamily(
            "chatbox_encoder_cpu_seconds",
            "CPU time the sentence encoder's lane threads spent encoding (urgent: messages,"
            " searches, facts; background: answer windows, documents, the embeddings API)",
            labels=("lane",),
        )
        for lane, seconds in figures.get("cpu_s", {}).items():
            cpu.add_metric([str(lane)], float(seconds))
        yield cpu
        screened = CounterMetricFamily(
            "chatbox_encoder_screened",
            "Texts read to the encoder's cut for moderation: stopped there (nothing found) or"
            " finished",
            labels=("outcome",),
        )
        for outcome, n in figures.get("screened", {}).items():
            screened.add_metric([str(outcome)], float(n))
        yield screened
