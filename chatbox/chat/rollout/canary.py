"""Canary verdicts as a service: samples from answers as they settle and sampled live
answers' eval scores, per canary arm and tier baseline; the decision rule
(chatbox/chat/rollout/canary_rule.py) applied on a timer; promote, hold and roll back, every
decision recorded (store and audit log).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from chatbox.accounts import AuditLog
from chatbox.accounts.audit import SYSTEM, Actor
from chatbox.chat.admission import Ticket
from chatbox.chat.policy import Canary, Policy
from chatbox.chat.rollout.canary_rule import (
    MIN_SAMPLES,
    RULES,
    Comparison,
    Moments,
    Rule,
    Sample,
    Side,
    Verdict,
    compare,
    verdict,
)
from chatbox.chat.rollout.evalsuite import Similarity
from chatbox.chat.rollout.live_grading import Grade, KeepsNothing, LiveGrader
from chatbox.chat.routing import CanaryState as State
from chatbox.engine.types import Usage
from chatbox.observability.verdicts import VerdictGauges
from chatbox.store import Store, User
from chatbox.store.canaries import Action, CanaryEvent, StartedCanary, StoredVerdict

__all__ = [
    "MIN_SAMPLES",
    "RULES",
    "CanaryService",
    "Comparison",
    "Moments",
    "Rule",
    "Sample",
    "Side",
    "Verdict",
    "canary_status",
    "compare",
    "verdict",
]

log = logging.getLogger("chatbox.canary")
Clock = Callable[[], float]
CHECK_EVERY_S = 15.0
STATE_OF: dict[str, State] = {
    "promote": "promoted",
    "rollback": "rolled_back",
    "hold": "held",
    "resume": "running",
}


@dataclass
class Sides:
    arms: dict[str, Side] = field(default_factory=dict)  # by arm
    baselines: dict[str, Side] = field(default_factory=dict)  # by tier

    def arm(self, name: str) -> Side:
        return self.arms.setdefault(name, Side())

    def baseline(self, tier: str) -> Side:
        return self.baselines.setdefault(tier, Side())


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
        similarity: Similarity | None = None,
        rng: random.Random | None = None,
        min_samples: int = MIN_SAMPLES,
    ) -> None:
        self.store = store
        self.policy = policy
        self.audit = audit
        self.clock = clock
        self.grader = LiveGrader(grade, similarity, keeps_nothing)
        self.rng = rng or random.Random()
        self.min_samples = min_samples
        self.sides = Sides()
        self.states: dict[str, CanaryEvent] = {}
        self.runtime: tuple[Canary, ...] = ()  # started by an admin, beside the policy's
        self.started = clock()
        self.latest: dict[str, Verdict] = {}
        self.gauges: VerdictGauges | None = None  # /metrics
        self._task: asyncio.Task[None] | None = None
        self._jobs: set[asyncio.Task[None]] = set()

    @property
    def canaries(self) -> tuple[Canary, ...]:
        """The policy file's canaries, then those an admin started at run time."""
        return self.policy.routing.canaries + self.runtime

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
        baseline (a picked or pinned model is neither); nothing ran and nothing failed, or
        moderation refused the message before any model ran: no sample (no model's doing)."""
        reason = ticket.route.reason
        if reason not in ("canary", "tier", "default") or (usage is None and not ticket.outcome):
            return
        if ticket.outcome == "refused" and usage is None:
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
                ticket.load,
            )
        )

    def observe_score(self, tier: str, arm: str, score: float, at: float | None = None) -> None:
        """An eval score of a sampled live answer (0..1)."""
        side = self.sides.arm(arm) if arm else self.sides.baseline(tier)
        side.scores.append((self.clock() if at is None else at, score))

    def check_suites(self) -> None:
        """Read every canary's eval suite now (a SuiteError names the canary and the file)."""
        for c in self.canaries:
            self.grader.references(c)

    def grades_tier(self, tier: str) -> bool:
        """Whether some canary of this tier grades sampled live answers."""
        return any(c.tier == tier and self.grader.can_grade(c) for c in self.canaries)

    def wants_eval(self, tier: str, arm: str) -> Canary | None:
        """The canary whose eval sampling takes this answer (drawn at its eval_percent)."""
        for c in self.canaries:
            if (
                c.tier == tier
                and self.grader.can_grade(c)
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
        if canary is None or not question or not answer:
            return
        task = asyncio.get_running_loop().create_task(
            self._grade_live(canary, user, arm, question, answer)
        )
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)

    async def _grade_live(
        self, canary: Canary, user: User, arm: str, question: str, answer: str
    ) -> None:
        try:
            score = await self.grader.score(canary, user, question, answer)
        except Exception:  # a busy or missing judge costs a sample, never the answer
            log.warning("grading a sampled answer of %s failed", canary.arm, exc_info=True)
            return
        if score is not None:
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
        """Decisions and canaries started or stopped elsewhere (the CLI) take effect here."""
        self.states = await self.store.canaries.states()
        self.runtime = tuple(_canary(c) for c in await self.store.canaries.started())

    async def start_canary(
        self,
        actor: Actor | User,
        model: str,
        tier: str,
        percent: float,
        installed: Collection[str],
        arm: str | None = None,
        reason: str = "",
    ) -> Canary:
        """Send `percent` of `tier`'s answers to `model` from the next check on, beside the
        policy file's canaries; refused (ValueError, naming the problem) on an unknown tier
        or model, a share outside (0, 100] or an arm name in use."""
        await self.refresh()
        arm = arm or f"canary-{model}"
        if tier not in self.policy.tiers:
            known = ", ".join(sorted(self.policy.tiers))
            raise ValueError(f"tier {tier!r} is not a tier of the policy (tiers: {known})")
        if model not in installed:
            names = ", ".join(sorted(installed)) or "none"
            raise ValueError(f"model {model!r} is not installed (installed: {names})")
        if isinstance(percent, bool) or not 0 < percent <= 100:
            raise ValueError(f"percent must be more than 0 and at most 100, not {percent!r}")
        if any(c.arm == arm for c in self.canaries):
            raise ValueError(f"a canary arm named {arm!r} runs already; name another (--arm)")
        who = Actor.of(actor)
        why = reason or f"started by {who.name}"
        try:
            await self.store.canaries.start(
                StartedCanary(arm, tier, model, float(percent), who.name, self.clock()), why
            )
        except KeyError:
            raise ValueError(f"a canary arm named {arm!r} runs already") from None
        await self.audit.record(
            actor, "canary.start", None, arm=arm, tier=tier, model=model, percent=percent
        )
        log.warning("canary %s (%s on tier %s, %g%%) started: %s", arm, model, tier, percent, why)
        await self.refresh()
        return self.canary(arm)

    async def stop_canary(self, actor: Actor | User, arm: str, reason: str = "") -> Canary:
        """Stop a canary started at run time (its arm gets no more answers); one in the policy
        file is rolled back or removed there instead (LookupError, saying so)."""
        await self.refresh()
        if any(c.arm == arm for c in self.policy.routing.canaries):
            raise LookupError(
                f"canary arm {arm!r} is in the policy file: roll it back (chatbox canary"
                " rollback) or remove it there"
            )
        who = Actor.of(actor)
        gone = await self.store.canaries.stop(arm, reason or f"stopped by {who.name}", who.name)
        if gone is None:
            names = ", ".join(c.arm for c in self.runtime) or "none runs"
            raise LookupError(f"no canary started at run time is named {arm!r} ({names})")
        await self.audit.record(
            actor, "canary.stop", None, arm=arm, tier=gone.tier, model=gone.model, reason=reason
        )
        log.warning("canary %s (%s on tier %s) stopped", arm, gone.model, gone.tier)
        await self.refresh()
        return _canary(gone)

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
    started = {c.arm: c for c in await store.canaries.started()}
    out = []
    for c in policy.routing.canaries + tuple(_canary(s) for s in started.values()):
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
                "started_by": started[c.arm].actor_name if c.arm in started else None,
                "state": STATE_OF[event.action] if event else "running",
                "decided_by": event.actor_name if event else None,
                "decided_at": event.at if event else None,
                "decision_reason": event.reason if event else None,
                "verdict": v,
                "events": [e.__dict__ for e in await store.canaries.events(c.arm, 20)],
            }
        )
    return out


def _canary(started: StartedCanary) -> Canary:
    """A canary started at run time, as the policy file's are: no judge, no eval share, the
    guard's automatic rollback on."""
    return Canary(started.tier, started.model, started.percent, started.arm)
