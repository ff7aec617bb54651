"""Moderation metrics: checks, flags and blocks by category and direction; latency."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


class ModerationMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.checks = Counter(
            "chatbox_moderation_checks_total",
            "Texts checked, by direction (input, output, document, memory, api)",
            ["direction"],
            registry=registry,
        )
        self.cached = Counter(
            "chatbox_moderation_cached_total",
            "Texts not checked again: their verdict was remembered (a re-sent history)",
            ["direction"],
            registry=registry,
        )
        self.flags = Counter(
            "chatbox_moderation_flags_total",
            "Checks that warned or flagged, by direction, category and action",
            ["direction", "category", "action"],
            registry=registry,
        )
        self.blocks = Counter(
            "chatbox_moderation_blocks_total",
            "Checks that blocked, by direction and category",
            ["direction", "category"],
            registry=registry,
        )
        self.latency = Histogram(
            "chatbox_moderation_latency_seconds",
            "Time of one check (every layer together), by direction",
            ["direction"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
            registry=registry,
        )
