"""Canary verdicts: each canary arm against its tier's baseline, metric by metric, with an
always-valid confidence interval, and the decision rule that rolls a canary back, holds it
or calls it ready (docs/observability.md states the rule for admins).

The verdict is a pure function of samples and a clock (`verdict`), so a replay can drive it
in accelerated time; `CanaryService` collects the samples from answers as they settle,
applies the rule on a timer, and records every decision (store and audit log).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from chatbox.accounts import AuditLog
from chatbox.accounts.audit import SYSTEM, Actor
from chatbox.chat.admission import Ticket
from chatbox.chat.policy import Canary, Policy
from chatbox.chat.routing import CanaryState as State
from chatbox.engine.types import Usage
from chatbox.observability.verdicts import VerdictGauges
from chatbox.store import Store, User
from chatbox.store.canaries import Action, CanaryEvent, StoredVerdict

log = logging.getLogger("chatbox.canary")
Clock = Callable[[], float]
Kind = Literal["guard", "quality", "info"]
Outcome = Literal["few", "worse", "ok", "unsure", "info"]
VerdictName = Literal["collecting", "continue", "ready", "hold", "rollback"]
ALPHA = 0.05  # the chance a decision is wrong when the arms are in truth alike
MIN_SAMPLES = 30  # per side before any metric decides anything
MAX_SAMPLES = 20_000  # per side: the newest are kept
CHECK_EVERY_S = 15.0
STATE_OF: dict[str, State] = {
    "promote": "promoted",
    "rollback": "rolled_back",
    "hold": "held",
    "resume": "running",
}


@dataclass(frozen=True)
class Sample:
    """One settled answer of a tier: its arm ("" for the baseline) and what it measured."""

    at: float
    tier: str
    arm: str
    ttft_s: float | None = None
    tokens_per_s: float | None = None
    error: bool = False
    refused: bool = False  # moderation refused the message or filtered the answer
    length: int = 0  # completion tokens


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
    quantiles: dict[str, Any] = field(default_factory=dict)

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
            **({"quantiles": self.quantiles} if self.quantiles else {}),
        }


def half_width(var_of_diff: float, tau: float, alpha: float = ALPHA) -> float:
    """The always-valid (mixture sequential probability ratio) interval's half-width for a
    difference of means with variance `var_of_diff`, mixing over effects of scale `tau`:
    it holds at every look, so the rule may be applied after each sample."""
    v = max(var_of_diff, 1e-12)
    t2 = tau * tau
    return math.sqrt(v * (v + t2) / t2 * (2 * math.log(1 / alpha) + math.log((v + t2) / v)))


def compare(rule: Rule, arm: Moments, base: Moments, min_samples: int = MIN_SAMPLES) -> Comparison:
    """The rule applied to one metric's two sides."""
    diff = arm.mean - base.mean
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
        )
    v = arm.var / arm.n + base.var / base.n
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
    )


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

    ttft_a = values(done_a, lambda s: s.ttft_s)
    ttft_b = values(done_b, lambda s: s.ttft_s)
    moments = {
        "ttft": (
            Moments.of([math.log(v) for v in ttft_a]),
            Moments.of([math.log(v) for v in ttft_b]),
        ),
        "tokens_per_s": (
            Moments.of([math.log(v) for v in values(done_a, lambda s: s.tokens_per_s)]),
            Moments.of([math.log(v) for v in values(done_b, lambda s: s.tokens_per_s)]),
        ),
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
        c = compare(rule, ma, mb, min_samples)
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
    return Verdict(canary.arm, canary.tier, canary.model, name, reason, now, tuple(comparisons))


def _why(c: Comparison) -> str:
    rule = next(r for r in RULES if r.metric == c.metric)
    return (
        f"{c.metric} worse by {rule.shown(c.worsening)} (interval {rule.shown(c.low)}"
        f" to {rule.shown(c.high)}), beyond {rule.shown(c.threshold)}"
    )


# -- the service ----------------------------------------------------------------------------


@dataclass
class Sides:
    arms: dict[str, Side] = field(default_factory=dict)  # by arm
    baselines: dict[str, Side] = field(default_factory=dict)  # by tier

    def arm(self, name: str) -> Side:
        return self.arms.setdefault(name, Side())

    def baseline(self, tier: str) -> Side:
        return self.baselines.setdefault(tier, Side())


Grade = Callable[[str, str, str], Awaitable[float]]  # (judge, question, answer) -> 0..1
KeepsNothing = Callable[[User], Awaitable[bool]]


class CanaryService:
    """Samples per canary arm and tier baseline; verdicts on a timer; promote and roll back
    (by an admin, or automatically on a guard), every decision stored and audit-logged."""

    def __init__(
        self,
        store: Store,
        policy: Policy,
        audit: AuditLog,
        clock: Clock = time.time,
        grade: Grade | None = None,
        keeps_nothing: KeepsNothing | None = None,
        rng: random.Random | None = None,
        min_samples: int = MIN_SAMPLES,
    ) -> None:
        self.store = store
        self.policy = policy
        self.audit = audit
        self.clock = clock
        self.grade = grade
        self.keeps_nothing = keeps_nothing
        self.rng = rng or random.Random()
        self.min_samples = min_samples
        self.sides = Sides()
        self.states: dict[str, CanaryEvent] = {}
        self.started = clock()
        self.latest: dict[str, Verdict] = {}
        self.gauges: VerdictGauges | None = None  # /metrics
        self._task: asyncio.Task[None] | None = None
        self._jobs: set[asyncio.Task[None]] = set()

    @property
    def canaries(self) -> tuple[Canary, ...]:
        return self.policy.routing.canaries

    def canary(self, arm: str) -> Canary:
        found = next((c for c in self.canaries if c.arm == arm), None)
        if found is None:
            names = ", ".join(c.arm for c in self.canaries) or "none is configured"
            raise LookupError(f"no canary arm named {arm!r} ({names})")
        return found

    def state(self, arm: str) -> State:
        event = self.states.get(arm)
        return STATE_OF[event.action] if event is not None else "running"

    def since(self, arm: str) -> float:
        """Samples count from the process's start or the canary's last resume."""
        event = self.states.get(arm)
        return event.at if event is not None and event.action == "resume" else self.started

    # -- samples ----------------------------------------------------------------------

    def observe(self, sample: Sample) -> None:
        """One settled answer; kept only for a tier with a canary."""
        if not any(c.tier == sample.tier for c in self.canaries):
            return
        side = self.sides.arm(sample.arm) if sample.arm else self.sides.baseline(sample.tier)
        side.samples.append(sample)

    def settled(self, ticket: Ticket, usage: Usage | None, end: float) -> None:
        """A request's admission settled: its sample, where it is a canary's or its tier's
        baseline (a picked or pinned model is neither); nothing ran and nothing failed:
        no sample."""
        reason = ticket.route.reason
        if reason not in ("canary", "tier", "default") or (usage is None and not ticket.outcome):
            return
        ttft = tps = None
        if ticket.first_token_at is not None:
            ttft = ticket.first_token_at - ticket.admitted_at
            decode_s = end - ticket.first_token_at
            if usage is not None and usage.completion_tokens > 1 and decode_s > 0:
                tps = (usage.completion_tokens - 1) / decode_s
        self.observe(
            Sample(
                self.clock(),
                ticket.user.tier,
                ticket.route.arm if reason == "canary" else "",
                ttft,
                tps,
                ticket.outcome == "error",
                ticket.outcome in ("refused", "filtered"),
                usage.completion_tokens if usage is not None else 0,
            )
        )

    def observe_score(self, tier: str, arm: str, score: float, at: float | None = None) -> None:
        """An eval score of a sampled live answer (0..1)."""
        side = self.sides.arm(arm) if arm else self.sides.baseline(tier)
        side.scores.append((self.clock() if at is None else at, score))

    def wants_eval(self, tier: str, arm: str) -> Canary | None:
        """The canary whose eval sampling takes this answer (drawn at its eval_percent)."""
        for c in self.canaries:
            if (
                c.tier == tier
                and c.judge
                and c.eval_percent > 0
                and arm in ("", c.arm)
                and self.state(c.arm) in ("running", "held")
                and self.rng.random() * 100 < c.eval_percent
            ):
                return c
        return None

    def sample_live(self, user: User, arm: str, question: str, answer: str) -> None:
        """Grade a live answer in the background when its tier opted in (never for a request
        that keeps nothing: the text lives only in this task and the judge's request)."""
        canary = self.wants_eval(user.tier, arm)
        if canary is None or self.grade is None or not question or not answer:
            return
        task = asyncio.get_running_loop().create_task(
            self._grade_live(canary, user, arm, question, answer)
        )
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)

    async def _grade_live(
        self, canary: Canary, user: User, arm: str, question: str, answer: str
    ) -> None:
        if self.keeps_nothing is not None and await self.keeps_nothing(user):
            return
        assert self.grade is not None and canary.judge is not None
        try:
            score = await self.grade(canary.judge, question, answer)
        except Exception:  # a busy or missing judge costs a sample, never the answer
            log.warning("grading a sampled answer of %s failed", canary.arm, exc_info=True)
            return
        self.observe_score(user.tier, arm, score)

    async def load_feedback(self) -> None:
        """Thumbs per arm and per tier baseline, from the feedback the people gave."""
        for c in self.canaries:
            up, down = await self.store.feedback.tally_for(c.tier, c.arm, self.since(c.arm))
            self.sides.arm(c.arm).up, self.sides.arm(c.arm).down = up, down
            up, down = await self.store.feedback.tally_for(c.tier, None, self.since(c.arm))
            self.sides.baseline(c.tier).up, self.sides.baseline(c.tier).down = up, down

    # -- verdicts and decisions --------------------------------------------------------

    def verdicts(self, now: float | None = None) -> list[Verdict]:
        now = self.clock() if now is None else now
        return [
            verdict(
                c,
                self.sides.arm(c.arm),
                self.sides.baseline(c.tier),
                now,
                self.since(c.arm),
                self.min_samples,
            )
            for c in self.canaries
        ]

    async def tick(self, now: float | None = None) -> list[Verdict]:
        """Refresh states and feedback, compute every verdict, store it, and act: a guard's
        rollback (unless the canary turned it off) and a quality hold, each recorded once."""
        await self.refresh()
        await self.load_feedback()
        out = self.verdicts(now)
        for v in out:
            c = self.canary(v.arm)
            state = self.state(v.arm)
            self.latest[v.arm] = v
            await self.store.canaries.put_verdict(
                StoredVerdict(v.arm, v.tier, v.model, v.verdict, v.reason, v.as_dict(), v.at)
            )
            if state in ("promoted", "rolled_back"):
                continue
            if v.verdict == "rollback" and c.auto_rollback:
                await self._decide(SYSTEM, c, "rollback", v.reason, True, v.at)
            elif v.verdict == "hold" and state == "running":
                await self._decide(SYSTEM, c, "hold", v.reason, True, v.at)
        await self.publish()
        return out

    async def publish(self) -> None:
        """Hand the newest figures to /metrics."""
        if self.gauges is None:
            return
        self.gauges.update_canaries(await canary_status(self.store, self.policy, self.latest))
        latest = [r.as_dict() for r in await self.store.evals.latest()]
        self.gauges.update_evals(latest, await self.store.evals.counts())

    async def refresh(self) -> None:
        """Decisions made elsewhere (the CLI) take effect here."""
        self.states = await self.store.canaries.states()

    async def promote(self, actor: Actor | User, arm: str, reason: str = "") -> CanaryEvent:
        c = self.canary(arm)
        return await self._decide(actor, c, "promote", reason or "promoted by an admin")

    async def rollback(self, actor: Actor | User, arm: str, reason: str = "") -> CanaryEvent:
        c = self.canary(arm)
        return await self._decide(actor, c, "rollback", reason or "rolled back by an admin")

    async def resume(self, actor: Actor | User, arm: str, reason: str = "") -> CanaryEvent:
        c = self.canary(arm)
        return await self._decide(actor, c, "resume", reason or "resumed by an admin")

    async def _decide(
        self,
        actor: Actor | User,
        c: Canary,
        action: Action,
        reason: str,
        automatic: bool = False,
        at: float | None = None,
    ) -> CanaryEvent:
        who = Actor.of(actor)
        event = await self.store.canaries.add_event(
            c.arm, c.tier, c.model, action, reason, who.name, automatic, at
        )
        self.states[c.arm] = event
        await self.audit.record(
            actor,
            f"canary.{action}",
            None,
            arm=c.arm,
            tier=c.tier,
            model=c.model,
            automatic=automatic,
            reason=reason,
        )
        log.warning("canary %s (%s on tier %s): %s — %s", c.arm, c.model, c.tier, action, reason)
        return event

    async def status(self) -> list[dict[str, Any]]:
        """Each canary: its configuration, state, latest verdict and recent decisions."""
        await self.refresh()
        found = await canary_status(self.store, self.policy, self.latest)
        if self.gauges is not None:
            self.gauges.update_canaries(found)
        return found

    # -- the timer ----------------------------------------------------------------------

    def start(self, every_s: float = CHECK_EVERY_S) -> None:
        if self._task is not None:
            return

        async def loop() -> None:
            while True:
                try:
                    await self.tick()
                except Exception:  # one failed check must not stop the next
                    log.exception("checking the canaries failed")
                await asyncio.sleep(every_s)

        self._task = asyncio.get_running_loop().create_task(loop(), name="chatbox-canaries")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._jobs) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None


async def canary_status(
    store: Store, policy: Policy, latest: dict[str, Verdict] | None = None
) -> list[dict[str, Any]]:
    """The canaries as the CLI and the console show them (stored verdicts where this process
    has computed none)."""
    states = await store.canaries.states()
    stored = await store.canaries.verdicts()
    out = []
    for c in policy.routing.canaries:
        event = states.get(c.arm)
        mine = (latest or {}).get(c.arm)
        v: dict[str, Any] | None = mine.as_dict() if mine is not None else None
        if v is None and c.arm in stored:
            v = stored[c.arm].detail
        out.append(
            {
                "arm": c.arm,
                "tier": c.tier,
                "model": c.model,
                "percent": c.percent,
                "state": STATE_OF[event.action] if event else "running",
                "decided_by": event.actor_name if event else None,
                "decided_at": event.at if event else None,
                "decision_reason": event.reason if event else None,
                "verdict": v,
                "events": [e.__dict__ for e in await store.canaries.events(c.arm, 20)],
            }
        )
    return out
