"""What the alert rules read and how a baseline learns: each rule's signal per instance from
a sample of the console's metric ring, the shipped rules, and the EWMA baseline a rule
breaches against (chatbox/observability/alerts.py fires, silences and posts them)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from chatbox.observability.ring import Snapshot

_SOURCES = ("chatbox_engine_", "chatbox_remote_")
# Below this many events in a sample, a rate says nothing (one error of two is not 50%).
MIN_EVENTS = 3


@dataclass(frozen=True)
class Sample:
    """What a rule reads at one evaluation: the ring's derived row and the registry now
    and at the previous sample (for rates of counters)."""

    row: Mapping[str, float]
    now: Snapshot
    before: Snapshot | None
    disk_used: float | None = None  # the data directory's disk, fraction in use


Signal = Callable[[Sample], dict[str, float | None]]  # instance -> value (None: no data)


def _delta(s: Sample, name: str, where: Callable[[dict[str, str]], bool]) -> float:
    """How much the counter samples `name` matching `where` grew since the previous sample."""
    total = 0.0
    for (metric, labels), value in s.now.items():
        if metric == name and where(dict(labels)):
            before = s.before.get((metric, labels), 0.0) if s.before is not None else value
            total += max(0.0, value - before)
    return total


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole >= MIN_EVENTS else None


def _finished(s: Sample, reasons: Sequence[str] | None = None) -> float:
    return sum(
        _delta(
            s, p + "requests_total", lambda d: reasons is None or d.get("finish_reason") in reasons
        )
        for p in _SOURCES
    )


def ttft_p99(s: Sample) -> dict[str, float | None]:
    """p99 time to first token per model over the ring's window (seconds)."""
    return {k.split("|", 1)[1]: v for k, v in s.row.items() if k.startswith("ttft_p99_s|")}


def error_rate(s: Sample) -> dict[str, float | None]:
    """Share of finished answers that failed since the previous sample."""
    return {"": _share(_finished(s, ("error",)), _finished(s))}


def refusal_rate(s: Sample) -> dict[str, float | None]:
    """Share of moderation checks of messages and answers that blocked (refused or cut)."""
    chat = ("input", "output")
    blocks = _delta(s, "chatbox_moderation_blocks_total", lambda d: d.get("direction") in chat)
    checks = _delta(s, "chatbox_moderation_checks_total", lambda d: d.get("direction") in chat)
    return {"": _share(blocks, checks)}


def queue_depth(s: Sample) -> dict[str, float | None]:
    """Requests waiting for a slot, all models together."""
    waiting = [v for k, v in s.row.items() if k.startswith("queue_depth|")]
    return {"": sum(waiting) if waiting else None}


def shed_rate(s: Sample) -> dict[str, float | None]:
    """Share of admission decisions that shed a request since the previous sample."""
    name = "chatbox_admission_decisions_total"
    shed = _delta(s, name, lambda d: d.get("decision") == "shed")
    return {"": _share(shed, _delta(s, name, lambda d: True))}


def replicas_down(s: Sample) -> dict[str, float | None]:
    """1 for each replica the front's health checks see down, 0 for each up."""
    return {
        dict(labels)["replica"]: 1.0 - value
        for (metric, labels), value in s.now.items()
        if metric == "chatbox_replica_up" and "replica" in dict(labels)
    }


def disk_used(s: Sample) -> dict[str, float | None]:
    """The fraction of the data directory's disk in use."""
    return {"": s.disk_used}


@dataclass(frozen=True)
class Rule:
    """One alert: a signal, the bound it must not cross, and how long before it changes."""

    name: str  # Alertmanager's `alertname`
    signal: Signal
    summary: str  # "{instance}", "{value}" and "{bound}" are filled in
    instance: str = ""  # the label naming what a value is of (model, replica), if any
    severity: Literal["warning", "critical"] = "warning"
    sigmas: float = 4.0  # baseline rules: fire above mean + sigmas * std
    floor: float = 0.0  # ... and only above this, however quiet the baseline
    fire_at: float | None = None  # a fixed rule: fire at or above this
    clear_at: float | None = None  # ... and resolve below this
    for_n: int = 2  # breaching samples in a row before it fires
    resolve_n: int = 3  # clear samples in a row before it resolves
    warmup: int = 12  # quiet samples a baseline needs before it may fire
    alpha: float = 0.05  # EWMA weight of each new quiet sample (about the last 20)
    percent: bool = False  # the signal is a fraction, shown as a percentage

    def show(self, value: float) -> str:
        return f"{value * 100:.3g}%" if self.percent else f"{value:.3g}"


RULES: tuple[Rule, ...] = (
    Rule(
        "ChatboxTTFTHigh",
        ttft_p99,
        "p99 time to first token of {instance} is {value}s (usually under {bound}s)",
        "model",
        floor=1.0,
    ),
    Rule(
        "ChatboxErrorRateHigh",
        error_rate,
        "{value} of answers failed (usually under {bound})",
        severity="critical",
        floor=0.05,
        percent=True,
    ),
    Rule(
        "ChatboxRefusalRateHigh",
        refusal_rate,
        "moderation blocked {value} of messages and answers (usually under {bound})",
        floor=0.2,
        percent=True,
    ),
    Rule(
        "ChatboxQueueDeep",
        queue_depth,
        "{value} requests wait for a slot (usually under {bound})",
        floor=4.0,
    ),
    Rule(
        "ChatboxShedding",
        shed_rate,
        "{value} of requests were shed (usually under {bound})",
        floor=0.05,
        percent=True,
    ),
    Rule(
        "ChatboxReplicaDown",
        replicas_down,
        "replica {instance} is down",
        "replica",
        severity="critical",
        fire_at=1.0,
        clear_at=0.5,
    ),
    Rule(
        "ChatboxDiskFilling",
        disk_used,
        "the data directory's disk is {value} full",
        severity="critical",
        fire_at=0.9,
        clear_at=0.85,
        percent=True,
    ),
)


@dataclass
class Baseline:
    """An exponentially weighted mean and variance of a signal's quiet samples."""

    mean: float = 0.0
    var: float = 0.0
    n: int = 0

    def learn(self, value: float, alpha: float) -> None:
        if self.n == 0:
            self.mean = value
        else:
            diff = value - self.mean
            self.mean += alpha * diff
            self.var = (1 - alpha) * (self.var + alpha * diff * diff)
        self.n += 1

    @property
    def std(self) -> float:
        return math.sqrt(max(0.0, self.var))

    def as_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "var": self.var, "n": self.n}

    @classmethod
    def from_dict(cls, raw: Any) -> Baseline | None:
        """A kept baseline; None for one that does not read as one."""
        try:
            mean, var, n = float(raw["mean"]), float(raw["var"]), int(raw["n"])
        except (KeyError, TypeError, ValueError):
            return None
        if not (math.isfinite(mean) and math.isfinite(var)) or var < 0 or n < 0:
            return None
        return cls(mean, var, n)
