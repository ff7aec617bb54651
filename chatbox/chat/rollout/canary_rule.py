"""The canary decision rule, as pure statistics: each metric of an arm against its tier's
baseline with an always-valid confidence interval, and the rule that turns the comparisons
into a verdict (rollback, hold, ready, continue). A pure function of samples and a clock, so a
replay can drive it in accelerated time (docs/observability.md states the rule for admins).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from chatbox.chat.policy import Canary

Kind = Literal["guard", "quality", "info"]
Outcome = Literal["few", "worse", "ok", "unsure", "info"]
VerdictName = Literal["collecting", "continue", "ready", "hold", "rollback"]
ALPHA = 0.05  # the chance a decision is wrong when the arms are in truth alike
MIN_SAMPLES = 30  # per side before any metric decides anything
MAX_SAMPLES = 20_000  # per side: the newest are kept


@dataclass(frozen=True)
class Sample:
    """One settled answer of a tier: its arm ("" for the baseline) and what it measured."""

    at: float
    tier: str
    arm: str
    ttft_s: float | None = None
    tokens_per_s: float | None = None
    error: bool = False
    refused: bool = False  # moderation filtered the answer (a refused message is no sample)
    length: int = 0  # completion tokens
    load: int | None = None  # requests already in its engine when it was admitted


@dataclass(frozen=True)
class Rule:
    """One metric: what it is for (a guard rolls back, quality holds, info only shows), which
    way is worse, and by how much a difference matters (on the log scale for ratios)."""

    metric: str
    kind: Kind
    worse: Literal["higher", "lower"]
    threshold: float
    tau: float  # the scale of differences the sequential test is tuned to find
    log_scale: bool = False

    def shown(self, value: float) -> str:
        """A difference as an admin reads it: a percentage for ratios, else points or units."""
        if self.log_scale:
            return f"{math.expm1(value) * 100:+.0f}%"
        if self.metric.endswith("rate") or self.metric in ("thumbs_up", "eval_score"):
            return f"{value * 100:+.1f} pts"
        return f"{value:+.1f}"


RULES: tuple[Rule, ...] = (
    Rule("ttft", "guard", "higher", math.log(1.25), 0.5, log_scale=True),
    Rule("tokens_per_s", "guard", "lower", math.log(1.25), 0.5, log_scale=True),
    Rule("error_rate", "guard", "higher", 0.02, 0.1),
    Rule("refusal_rate", "guard", "higher", 0.02, 0.1),
    Rule("thumbs_up", "quality", "lower", 0.05, 0.2),
    Rule("eval_score", "quality", "lower", 0.05, 0.2),
    Rule("answer_length", "info", "lower", 0.0, 1.0),
)


@dataclass(frozen=True)
class Moments:
    """A side's sample size, mean and variance of one metric."""

    n: int
    mean: float
    var: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Moments:
        n = len(values)
        if n == 0:
            return cls(0, 0.0, 0.0)
        mean = sum(values) / n
        var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
        return cls(n, mean, var)

    @classmethod
    def bernoulli(cls, hits: int, n: int) -> Moments:
        """A rate, its variance from a smoothed rate so that 0 of n still has some."""
        if n == 0:
            return cls(0, 0.0, 0.0)
        p = (hits + 0.5) / (n + 1)
        return cls(n, hits / n, p * (1 - p))


@dataclass(frozen=True)
class Comparison:
    """Arm minus baseline for one metric: the difference in the worse direction (positive:
    the arm is worse), its always-valid interval, and what the rule concludes."""

    metric: str
    kind: Kind
    arm: Moments
    baseline: Moments
    worsening: float
    low: float
    high: float
    threshold: float
    outcome: Outcome
    shown: str = ""
    shown_interval: tuple[str, str] = ("", "")  # low and high as `shown` writes them
    quantiles: dict[str, Any] = field(default_factory=dict)
    var_of_diff: float = 0.0
    more_needed: int | None = None  # answers a side before it can decide (as now)

    def as_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "kind": self.kind,
            "arm": {"n": self.arm.n, "mean": self.arm.mean},
            "baseline": {"n": self.baseline.n, "mean": self.baseline.mean},
            "worsening": self.worsening,
            "interval": [self.low, self.high],
            "threshold": self.threshold,
            "outcome": self.outcome,
            "shown": self.shown,
            "shown_interval": list(self.shown_interval),
            "more_needed": self.more_needed,
            **({"quantiles": self.quantiles} if self.quantiles else {}),
        }


def half_width(var_of_diff: float, tau: float, alpha: float = ALPHA) -> float:
    """The always-valid (mixture sequential probability ratio) interval's half-width for a
    difference of means with variance `var_of_diff`, mixing over effects of scale `tau`:
    it holds at every look, so the rule may be applied after each sample."""
    v = max(var_of_diff, 1e-12)
    t2 = tau * tau
    return math.sqrt(v * (v + t2) / t2 * (2 * math.log(1 / alpha) + math.log((v + t2) / v)))


def compare(
    rule: Rule,
    arm: Moments,
    base: Moments,
    min_samples: int = MIN_SAMPLES,
    adjusted: tuple[float, float] | None = None,
) -> Comparison:
    """The rule applied to one metric's two sides; `adjusted`: the difference (arm minus
    baseline) and its variance where they are not the plain means' (load strata)."""
    diff = arm.mean - base.mean if adjusted is None else adjusted[0]
    worsening = diff if rule.worse == "higher" else -diff
    outcome: Outcome
    if rule.kind == "info" or arm.n == 0 or base.n == 0:
        outcome = "info" if rule.kind == "info" else "few"
        return Comparison(
            rule.metric,
            rule.kind,
            arm,
            base,
            worsening,
            worsening,
            worsening,
            rule.threshold,
            outcome,
            rule.shown(worsening),
            (rule.shown(worsening), rule.shown(worsening)),
        )
    v = arm.var / arm.n + base.var / base.n if adjusted is None else adjusted[1]
    h = half_width(v, rule.tau)
    low, high = worsening - h, worsening + h
    if arm.n < min_samples or base.n < min_samples:
        outcome = "few"
    elif low > rule.threshold:
        outcome = "worse"
    elif high < rule.threshold:
        outcome = "ok"
    else:
        outcome = "unsure"
    return Comparison(
        rule.metric,
        rule.kind,
        arm,
        base,
        worsening,
        low,
        high,
        rule.threshold,
        outcome,
        rule.shown(worsening),
        (rule.shown(low), rule.shown(high)),
        var_of_diff=v,
    )


def load_stratum(load: int | None) -> int | None:
    """Engine loads that count as alike: each of 0 to 7, then 8-15, 16-31, ... (None: not
    known)."""
    if load is None:
        return None
    return max(0, load) if load < 8 else 4 + load.bit_length()


def stratified(
    arm: Sequence[tuple[int | None, float]], base: Sequence[tuple[int | None, float]]
) -> tuple[Moments, Moments, tuple[float, float] | None]:
    """Speed compared only between answers that ran under alike engine load: (load, value)
    pairs of each side are grouped by `load_stratum`, each stratum that both sides have
    gives a difference of means, and these are averaged with weights n_a*n_b/(n_a+n_b) (the
    inverse of the difference's variance when spreads are alike). Returns the two sides'
    matched samples and the weighted difference with its variance (None: no stratum both
    sides have)."""
    groups: dict[int | None, tuple[list[float], list[float]]] = {}
    for side, pairs in ((0, arm), (1, base)):
        for load, value in pairs:
            groups.setdefault(load_stratum(load), ([], []))[side].append(value)
    shared = [(a, b) for a, b in groups.values() if a and b]
    matched_a = Moments.of([v for a, _ in shared for v in a])
    matched_b = Moments.of([v for _, b in shared for v in b])
    if not shared:
        return matched_a, matched_b, None
    pooled = _pooled_var(shared)
    weights = [len(a) * len(b) / (len(a) + len(b)) for a, b in shared]
    total = sum(weights)
    diff = var = 0.0
    for w, (a, b) in zip(weights, shared, strict=True):
        ma, mb = Moments.of(a), Moments.of(b)
        va = ma.var if ma.n > 1 else pooled
        vb = mb.var if mb.n > 1 else pooled
        diff += w / total * (ma.mean - mb.mean)
        var += (w / total) ** 2 * (va / ma.n + vb / mb.n)
    return matched_a, matched_b, (diff, var)


def _pooled_var(groups: Sequence[tuple[list[float], list[float]]]) -> float:
    """The within-stratum variance over every stratum, for a stratum too small for its own."""
    ss = dof = 0.0
    for a, b in groups:
        for xs in (a, b):
            if len(xs) > 1:
                m = Moments.of(xs)
                ss += m.var * (m.n - 1)
                dof += m.n - 1
    return ss / dof if dof else 0.0


def more_needed(c: Comparison, tau: float, now_n: int, scale: float = 1.0) -> int | None:
    """About how many more answers a side the metric needs before its interval clears its
    threshold, if the difference and its spread stay as they are now (None: decided, shown
    only, or the difference sits so near the threshold that MAX_SAMPLES would not do).
    `scale`: answers per counted sample (speed counts only answers in shared load strata)."""
    if c.kind == "info" or c.outcome in ("ok", "worse") or now_n <= 0:
        return None
    gap = abs(c.worsening - c.threshold)
    n = now_n
    while half_width(c.var_of_diff * now_n / n, tau) >= gap:
        if n >= MAX_SAMPLES:
            return None
        n = min(MAX_SAMPLES, max(n + 1, math.ceil(n * 1.1)))
    return max(1, math.ceil((n - now_n) * scale))


def quantile_interval(values: Sequence[float], q: float, alpha: float = ALPHA) -> dict[str, float]:
    """A quantile with its distribution-free interval (order statistics, normal approx.)."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return {}
    z = _z(alpha)
    spread = z * math.sqrt(n * q * (1 - q))
    lo = max(0, math.floor(n * q - spread))
    hi = min(n - 1, math.ceil(n * q + spread))
    mid = min(n - 1, int(n * q))
    return {"value": xs[mid], "low": xs[lo], "high": xs[hi]}


def _z(alpha: float) -> float:
    """The two-sided normal quantile for a few common alphas."""
    return {0.05: 1.96, 0.01: 2.576, 0.1: 1.645}.get(alpha, 1.96)


@dataclass(frozen=True)
class Verdict:
    arm: str
    tier: str
    model: str
    verdict: VerdictName
    reason: str
    at: float
    metrics: tuple[Comparison, ...] = ()
    more_needed: int | None = None  # answers a side before a decision, as things stand

    @property
    def deciding(self) -> str | None:
        """The metric that decided (rollback or hold), if one did."""
        kind = {"rollback": "guard", "hold": "quality"}.get(self.verdict)
        return next(
            (c.metric for c in self.metrics if c.kind == kind and c.outcome == "worse"), None
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "tier": self.tier,
            "model": self.model,
            "verdict": self.verdict,
            "reason": self.reason,
            "metric": self.deciding,
            "at": self.at,
            "more_needed": self.more_needed,
            "metrics": [c.as_dict() for c in self.metrics],
        }


@dataclass
class Side:
    """One side's samples (an arm, or a tier's baseline), the newest MAX_SAMPLES kept."""

    samples: deque[Sample] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    scores: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    up: int = 0
    down: int = 0

    def since(self, t: float) -> list[Sample]:
        return [s for s in self.samples if s.at >= t]

    def scores_since(self, t: float) -> list[float]:
        return [v for at, v in self.scores if at >= t]


def verdict(
    canary: Canary,
    arm: Side,
    base: Side,
    now: float,
    since: float = 0.0,
    min_samples: int = MIN_SAMPLES,
) -> Verdict:
    """The decision rule: any guard worse beyond its threshold with confidence: rollback;
    else any quality metric so: hold; else every guard and quality metric with enough
    samples shown not worse beyond its threshold: ready; else continue (collecting while
    either side has fewer than `min_samples`)."""
    a, b = arm.since(since), base.since(since)
    done_a = [s for s in a if not s.error and not s.refused]
    done_b = [s for s in b if not s.error and not s.refused]

    def values(side: list[Sample], get: Callable[[Sample], float | None]) -> list[float]:
        return [v for v in (get(s) for s in side) if v is not None and v > 0]

    def logs(side: list[Sample], get: Callable[[Sample], float | None]) -> list[tuple[Any, float]]:
        return [(s.load, math.log(v)) for s in side if (v := get(s)) is not None and v > 0]

    ttft_a = values(done_a, lambda s: s.ttft_s)
    ttft_b = values(done_b, lambda s: s.ttft_s)
    # Speed is compared only under alike engine load: a less busy engine is no better model.
    speed: dict[str, tuple[Moments, Moments, tuple[float, float] | None, float]] = {}
    for metric, get in (("ttft", _ttft), ("tokens_per_s", _tokens_per_s)):
        pa, pb = logs(done_a, get), logs(done_b, get)
        ma, mb, adjusted = stratified(pa, pb)
        scale = (len(pa) + len(pb)) / max(1, ma.n + mb.n)  # answers per matched answer
        speed[metric] = (ma, mb, adjusted, scale)
    moments = {
        "ttft": speed["ttft"][:2],
        "tokens_per_s": speed["tokens_per_s"][:2],
        "error_rate": (
            Moments.bernoulli(sum(s.error for s in a), len(a)),
            Moments.bernoulli(sum(s.error for s in b), len(b)),
        ),
        "refusal_rate": (
            Moments.bernoulli(sum(s.refused for s in a), len(a)),
            Moments.bernoulli(sum(s.refused for s in b), len(b)),
        ),
        "thumbs_up": (
            Moments.bernoulli(arm.up, arm.up + arm.down),
            Moments.bernoulli(base.up, base.up + base.down),
        ),
        "eval_score": (Moments.of(arm.scores_since(since)), Moments.of(base.scores_since(since))),
        "answer_length": (
            Moments.of([float(s.length) for s in done_a]),
            Moments.of([float(s.length) for s in done_b]),
        ),
    }
    comparisons = []
    for rule in RULES:
        ma, mb = moments[rule.metric]
        adjusted, scale = speed[rule.metric][2:] if rule.metric in speed else (None, 1.0)
        if rule.metric in speed and adjusted is None:
            ma, mb = Moments(0, 0.0, 0.0), Moments(0, 0.0, 0.0)  # no load both sides had
        c = compare(rule, ma, mb, min_samples, adjusted)
        if c.outcome != "info":
            need = more_needed(c, rule.tau, min(ma.n, mb.n), scale)
            if min(ma.n, mb.n) < min_samples:  # no metric decides before min_samples a side
                short = math.ceil((min_samples - min(ma.n, mb.n)) * scale)
                need = short if need is None else max(need, short)
            c = replace(c, more_needed=need)
        if rule.metric == "ttft":
            c = Comparison(
                **{
                    **c.__dict__,
                    "quantiles": {
                        "arm": {
                            "p50": quantile_interval(ttft_a, 0.5),
                            "p99": quantile_interval(ttft_a, 0.99),
                        },
                        "baseline": {
                            "p50": quantile_interval(ttft_b, 0.5),
                            "p99": quantile_interval(ttft_b, 0.99),
                        },
                    },
                }
            )
        comparisons.append(c)
    needs = [c.more_needed for c in comparisons if c.kind != "info" and c.outcome != "ok"]
    heading_worse = [
        c.more_needed
        for c in comparisons
        if c.kind != "info" and c.more_needed is not None and c.worsening > c.threshold
    ]
    more: int | None = None
    if heading_worse:
        more = min(n for n in heading_worse if n is not None)
    elif needs and all(n is not None for n in needs):
        more = max(n for n in needs if n is not None)
    worse_guard = [c for c in comparisons if c.kind == "guard" and c.outcome == "worse"]
    worse_quality = [c for c in comparisons if c.kind == "quality" and c.outcome == "worse"]
    deciding = [c for c in comparisons if c.kind != "info" and c.outcome != "few"]
    guards = [c for c in comparisons if c.kind == "guard"]
    name: VerdictName
    if worse_guard:
        name, reason = "rollback", "; ".join(_why(c) for c in worse_guard)
    elif worse_quality:
        name, reason = "hold", "; ".join(_why(c) for c in worse_quality)
    elif len(a) < min_samples or len(b) < min_samples:
        name = "collecting"
        reason = (
            f"{len(a)} canary and {len(b)} baseline answers; a decision needs {min_samples} each"
        )
    elif all(c.outcome == "ok" for c in guards) and all(c.outcome == "ok" for c in deciding):
        name, reason = "ready", "every guard and quality metric is within its threshold"
    else:
        unsure = [c.metric for c in deciding if c.outcome != "ok"]
        name, reason = "continue", "not yet sure about " + ", ".join(unsure)
    if name in ("collecting", "continue"):
        reason += (
            f"; needs ~{more} more answers a side to decide"
            if more is not None
            else "; the arms look too alike to decide within the samples kept"
            if needs
            else ""
        )
    else:
        more = None
    return Verdict(
        canary.arm, canary.tier, canary.model, name, reason, now, tuple(comparisons), more
    )


def _ttft(s: Sample) -> float | None:
    return s.ttft_s


def _tokens_per_s(s: Sample) -> float | None:
    return s.tokens_per_s


def _why(c: Comparison) -> str:
    rule = next(r for r in RULES if r.metric == c.metric)
    return (
        f"{c.metric} worse by {rule.shown(c.worsening)} (interval {rule.shown(c.low)}"
        f" to {rule.shown(c.high)}), beyond {rule.shown(c.threshold)}"
    )
