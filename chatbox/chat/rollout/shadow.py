"""Shadow traffic: a share of a tier's answers is asked again of a candidate model after the
real answer is done, only while the box has nothing else to do, and the two are compared.

The shadow request runs behind every other kind of work (`SHADOW_PRIORITY`) and only while
no user's request is anywhere on the box: in the HTTP layer (`Intake`, counted by the front's
ASGI middleware), admitted and waiting for its first token, or running or queued on any
engine (or the candidate's replicas are full). A user's request arriving cancels (sheds) a
running shadow at once, and a shadow that overlapped one is never compared. It never takes
a conversation's cached prefix, its KV is never parked (`persist=False`), and it is left out
of the engine's latency and request metrics (`metered=False`), so no alert reads it.

Only numbers are kept, never the shadow answer's text: its latency (time to first token,
tokens per second), its length, its moderation outcome and its similarity to the served
answer (the embedding encoder's cosine), beside the served answer's own. The text lives in
this process's memory while it is scored and is then dropped, so there is nothing of it to
erase and nothing is written under zero retention; a zero-retention request (asked by
`keeps_nothing`) is never mirrored at all. The comparisons are in memory (the console's
page) and in /metrics; the rules (which tier, which candidate, what share) are set and
cleared by an admin, each change in the audit log, and last until the process stops.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram

from chatbox.accounts.audit import Actor, AuditLog
from chatbox.chat.errors import InvalidInput, NotFound
from chatbox.chat.models import ModelProvider
from chatbox.chat.policy import Policy
from chatbox.chat.privacy.temporary import keeps_nothing
from chatbox.engine.types import (
    ChatMessage,
    DoneEvent,
    EngineEvent,
    EngineStats,
    Generation,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from chatbox.store import Store, User

log = logging.getLogger("chatbox.shadow")

SHADOW_PRIORITY = 20  # behind live answers (0-9), summaries (5) and memory extraction (10)
RECENT = 200  # comparisons the console lists
IDLE_WAIT_S = 5.0  # how long a mirrored request waits for the box to go idle before it is shed
CHECK_EVERY_S = 0.05  # how often a waiting or running shadow looks at the box's load
SHADOW_MAX_TOKENS = 512  # a shadow answer's cap (beside twice the served answer's length)
ROLES = ("served", "shadow")

Judge = Callable[[User, str], Awaitable[bool]]  # the text's moderation outcome: blocked?
Embed = Callable[[list[str]], Awaitable[np.ndarray]]  # unit vectors, one row per text
Loads = Callable[[], Mapping[str, EngineStats]]  # every local engine's load now


@dataclass
class Intake:
    """Users' requests in the HTTP layer now, counted by the front's ASGI middleware, and
    who is told the moment one arrives (a running shadow gives way)."""

    open: int = 0
    arrivals: int = 0  # every request that ever arrived: a shadow compares only if none did
    listeners: list[Callable[[], None]] = field(default_factory=list)

    def enter(self) -> None:
        self.open += 1
        self.arrivals += 1
        for listener in list(self.listeners):
            listener()

    def leave(self) -> None:
        self.open = max(0, self.open - 1)


def counts_as_user_request(method: str, path: str) -> bool:
    """Whether a request is a user's work that shadow traffic gives way to: anything but a
    read (GET, HEAD, OPTIONS) outside the admin API, the console, /metrics and static files."""
    if method in ("GET", "HEAD", "OPTIONS"):
        return False
    return not path.startswith(("/v1/admin/", "/console", "/metrics", "/static/"))


@dataclass(frozen=True)
class ShadowRule:
    """Mirror `percent` of the `tier`'s answers to `candidate`."""

    tier: str
    candidate: str
    percent: float
    started_at: float
    started_by: str


@dataclass(frozen=True)
class Served:
    """What a served answer was, for its shadow: the prompt it answered and its numbers."""

    user: User
    model: str
    messages: tuple[ChatMessage, ...]
    text: str
    blocked: bool  # moderation cut or refused the served answer
    tokens: int
    ttft_s: float | None = None
    tokens_per_s: float | None = None
    cache_scope: str | None = None


@dataclass(frozen=True)
class Comparison:
    """One served answer beside its shadow: numbers only."""

    at: float
    started_at: float  # when the shadow request was sent (after the served answer ended)
    tier: str
    served_model: str
    candidate: str
    served_ttft_s: float | None
    shadow_ttft_s: float | None
    served_tokens_per_s: float | None
    shadow_tokens_per_s: float | None
    served_tokens: int
    shadow_tokens: int
    served_blocked: bool
    shadow_blocked: bool
    similarity: float | None


@dataclass
class Measured:
    """A generation's wall-clock latency, measured as its events arrive."""

    started: float = field(default_factory=time.perf_counter)
    first: float | None = None
    ended: float | None = None
    tokens: int = 0

    def token(self) -> None:
        if self.first is None:
            self.first = time.perf_counter()

    def done(self, completion_tokens: int) -> None:
        self.ended = time.perf_counter()
        self.tokens = completion_tokens

    @property
    def ttft_s(self) -> float | None:
        return None if self.first is None else self.first - self.started

    @property
    def tokens_per_s(self) -> float | None:
        if self.first is None or self.ended is None or self.tokens < 2:
            return None
        span = self.ended - self.first
        return (self.tokens - 1) / span if span > 0 else None


class ShadowMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        reg = registry if registry is not None else CollectorRegistry()
        self.requests = Counter(
            "chatbox_shadow_requests",
            "Answers offered to shadow traffic, by outcome (compared, shed, skipped_zdr, failed)",
            ["tier", "candidate", "outcome"],
            registry=reg,
        )
        self.ttft = Histogram(
            "chatbox_shadow_ttft_seconds",
            "Time to first token of a served answer and of its shadow",
            ["tier", "candidate", "role"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
            registry=reg,
        )
        self.speed = Histogram(
            "chatbox_shadow_tokens_per_second",
            "Decode speed of a served answer and of its shadow",
            ["tier", "candidate", "role"],
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000),
            registry=reg,
        )
        self.length = Histogram(
            "chatbox_shadow_answer_tokens",
            "Length of a served answer and of its shadow, in tokens",
            ["tier", "candidate", "role"],
            buckets=(8, 16, 32, 64, 128, 256, 512, 1024, 2048),
            registry=reg,
        )
        self.blocked = Counter(
            "chatbox_shadow_blocked",
            "Served answers and shadows that moderation would block",
            ["tier", "candidate", "role"],
            registry=reg,
        )
        self.similarity = Histogram(
            "chatbox_shadow_similarity",
            "Cosine similarity of a shadow answer to the served answer (embedding encoder)",
            ["tier", "candidate"],
            buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0),
            registry=reg,
        )

    def compared(self, c: Comparison) -> None:
        labels = (c.tier, c.candidate)
        self.requests.labels(*labels, "compared").inc()
        for role, ttft, speed, tokens, blocked in (
            ("served", c.served_ttft_s, c.served_tokens_per_s, c.served_tokens, c.served_blocked),
            ("shadow", c.shadow_ttft_s, c.shadow_tokens_per_s, c.shadow_tokens, c.shadow_blocked),
        ):
            if ttft is not None:
                self.ttft.labels(*labels, role).observe(ttft)
            if speed is not None:
                self.speed.labels(*labels, role).observe(speed)
            self.length.labels(*labels, role).observe(tokens)
            if blocked:
                self.blocked.labels(*labels, role).inc()
        if c.similarity is not None:
            self.similarity.labels(*labels).observe(c.similarity)


class Shed(Exception):
    """The box got busy: the shadow request gives way."""


@dataclass
class ShadowTraffic:
    """The admin's shadow rules per tier, the mirroring itself and its comparisons."""

    store: Store
    policy: Policy
    models: ModelProvider
    audit: AuditLog
    loads: Loads
    waiting: Callable[[], int] = lambda: 0  # admitted requests with no token yet (admission)
    intake: Intake = field(default_factory=Intake)
    judge: Judge | None = None
    embed: Embed | None = None
    registry: CollectorRegistry | None = None
    chance: Callable[[], float] = random.random
    clock: Callable[[], float] = time.time
    rules: dict[str, ShadowRule] = field(default_factory=dict)
    recent: deque[Comparison] = field(default_factory=lambda: deque(maxlen=RECENT))
    outcomes: dict[tuple[str, str, str], int] = field(default_factory=dict)
    _running: dict[str, int] = field(default_factory=dict)  # shadow requests per model
    _started: set[str] = field(default_factory=set)  # models a shadow request was sent to
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _live: set[Generation] = field(default_factory=set)  # shadow generations running now

    def __post_init__(self) -> None:
        self.metrics = ShadowMetrics(self.registry)
        self.intake.listeners.append(self._user_arrived)

    def _user_arrived(self) -> None:
        """A user's request came in: every running shadow is cancelled now, not at the next
        look at the engines."""
        for generation in list(self._live):
            generation.cancel()

    # -- the admin's rules ------------------------------------------------------------------

    async def start(
        self, actor: Actor | User, candidate: str, tier: str, percent: float
    ) -> ShadowRule:
        """Mirror `percent` (0 < p <= 100) of `tier`'s answers to `candidate`; audited."""
        if tier not in self.policy.tiers:
            known = ", ".join(sorted(self.policy.tiers))
            raise InvalidInput(f"no tier named {tier!r} (tiers: {known})", "tier")
        if candidate not in self.models.names():
            raise InvalidInput(f"no model named {candidate!r}", "candidate")
        if not 0 < percent <= 100:
            raise InvalidInput("percent must be more than 0 and at most 100", "percent")
        rule = ShadowRule(tier, candidate, percent, self.clock(), Actor.of(actor).name)
        self.rules[tier] = rule
        await self.audit.record(
            actor, "shadow.start", None, tier=tier, model=candidate, percent=percent
        )
        return rule

    async def stop(self, actor: Actor | User, tier: str) -> ShadowRule:
        """Stop mirroring the tier's answers; audited. Running shadows finish or are shed."""
        rule = self.rules.pop(tier, None)
        if rule is None:
            raise NotFound(f"no shadow traffic runs for the {tier} tier")
        await self.audit.record(actor, "shadow.stop", None, tier=tier, model=rule.candidate)
        return rule

    def status(self) -> dict[str, Any]:
        """The rules, each pair's summary (means and rates) and the recent comparisons."""
        pairs: dict[tuple[str, str, str], list[Comparison]] = {}
        for c in self.recent:
            pairs.setdefault((c.tier, c.served_model, c.candidate), []).append(c)
        return {
            "rules": [asdict(r) for r in self.rules.values()],
            "summary": [summarise(k, v, self.outcomes) for k, v in sorted(pairs.items())],
            "outcomes": [
                {"tier": t, "candidate": m, "outcome": o, "count": n}
                for (t, m, o), n in sorted(self.outcomes.items())
            ],
            "recent": [asdict(c) for c in reversed(self.recent)],
        }

    # -- mirroring ----------------------------------------------------------------------------

    async def offer(self, served: Served) -> None:
        """A served answer is done: mirror it when its tier's rule draws it and the request
        keeps something (never under zero retention)."""
        tier = self.policy.tier(served.user.tier).name
        rule = self.rules.get(tier)
        if rule is None or rule.candidate == served.model or not served.text.strip():
            return
        if self.chance() * 100 >= rule.percent:
            return
        if await keeps_nothing(self.store, self.policy, served.user):
            self._count(rule, "skipped_zdr")
            return
        if sum(self._running.values()) > 0:  # one shadow at a time: the next is shed
            self._count(rule, "shed")
            return
        self._running[rule.candidate] = self._running.get(rule.candidate, 0) + 1
        task = asyncio.create_task(self._mirror(rule, served))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def busy(self, candidate: str) -> bool:
        """Whether a user's request is in the HTTP layer, admitted, or runs or waits on any
        engine of the box (or the candidate's replicas have no free slot): shadow work gives
        way to it."""
        if self.intake.open > 0 or self.waiting() > 0:
            return True
        for name, stats in self.loads().items():
            if stats.queue_depth > 0 or stats.running > self._own(name):
                return True
        remote = self.models.stats(candidate)
        if remote is not None and candidate not in self.loads():
            return remote.queue_depth > 0 or remote.running >= max(1, remote.slots_total)
        return False

    def _own(self, name: str) -> int:
        return self._running.get(name, 0) if name in self._started else 0

    async def _mirror(self, rule: ShadowRule, served: Served) -> None:
        try:
            comparison = await self._compare(rule, served)
        except Shed:
            self._count(rule, "shed")
        except asyncio.CancelledError:
            raise
        except Exception:  # background work: log it, count it, never reach a user
            log.exception("shadow request to %s failed", rule.candidate)
            self._count(rule, "failed")
        else:
            self.recent.append(comparison)
            self.metrics.compared(comparison)
            self._bump(rule, "compared")
        finally:
            self._running[rule.candidate] -= 1
            self._started.discard(rule.candidate)

    async def _compare(self, rule: ShadowRule, served: Served) -> Comparison:
        waited = 0.0
        while self.busy(rule.candidate):  # the served answer's slot frees within a step or two
            if waited >= IDLE_WAIT_S:
                raise Shed
            await asyncio.sleep(CHECK_EVERY_S)
            waited += CHECK_EVERY_S
        engine = await self.models.engine(rule.candidate)
        request = GenerationRequest(
            served.messages,
            SamplingParams(max_tokens=min(SHADOW_MAX_TOKENS, max(16, 2 * served.tokens))),
            cache_key=None,  # never a conversation's cached prefix
            priority=SHADOW_PRIORITY,
            cache_scope=served.cache_scope,
            persist=False,  # its KV goes when it ends, never parked
            metered=False,  # no user waits on it: not in the figures alerts read
        )
        started_at = self.clock()
        arrivals = self.intake.arrivals
        generation = engine.submit(request)
        self._live.add(generation)
        self._started.add(rule.candidate)
        measured = Measured()
        parts: list[str] = []
        shed = False

        async def watch() -> None:
            nonlocal shed
            while True:
                await asyncio.sleep(CHECK_EVERY_S)
                if self.busy(rule.candidate):
                    shed = True
                    generation.cancel()
                    return

        watcher = asyncio.create_task(watch())
        done: DoneEvent | None = None
        try:
            async for event in generation:
                if isinstance(event, TokenEvent):
                    measured.token()
                    parts.append(event.text)
                elif isinstance(event, DoneEvent):
                    done = event
                    measured.done(event.usage.completion_tokens)
        finally:
            watcher.cancel()
            generation.cancel()
            self._live.discard(generation)
        if shed or done is None or done.finish_reason == "cancelled":
            raise Shed
        if self.intake.arrivals != arrivals:  # a user's request came while it ran
            raise Shed
        if done.finish_reason == "error":
            raise RuntimeError(done.error or "the shadow request failed")
        text = "".join(parts)
        blocked = await self.judge(served.user, text) if self.judge is not None else False
        similarity = None
        if self.embed is not None and text.strip():
            vectors = await self.embed([served.text, text])
            similarity = round(float(np.dot(vectors[0], vectors[1])), 4)
        ttft, speed = measured.ttft_s, measured.tokens_per_s
        if done.timings is not None:  # the engine's own figures leave out the event loop
            ttft = done.timings.queued_s + done.timings.prefill_s
            if done.timings.decode_s > 0 and measured.tokens > 1:
                speed = (measured.tokens - 1) / done.timings.decode_s
        return Comparison(
            self.clock(),
            started_at,
            rule.tier,
            served.model,
            rule.candidate,
            served.ttft_s,
            ttft,
            served.tokens_per_s,
            speed,
            served.tokens,
            measured.tokens,
            served.blocked,
            blocked,
            similarity,
        )

    def _count(self, rule: ShadowRule, outcome: str) -> None:
        self.metrics.requests.labels(rule.tier, rule.candidate, outcome).inc()
        self._bump(rule, outcome)

    def _bump(self, rule: ShadowRule, outcome: str) -> None:
        key = (rule.tier, rule.candidate, outcome)
        self.outcomes[key] = self.outcomes.get(key, 0) + 1

    async def shutdown(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class MirroredGeneration:
    """A stateless answer (the OpenAI-compatible API) offered to shadow traffic once its
    last event has been handed on: the caller has the whole answer before a shadow starts."""

    def __init__(
        self,
        inner: Generation,
        shadow: ShadowTraffic,
        user: User,
        model: str,
        messages: tuple[ChatMessage, ...],
    ) -> None:
        self.inner = inner
        self.shadow = shadow
        self.user = user
        self.model = model
        self.messages = messages

    @property
    def ticket(self) -> Any:  # the admission ticket (route headers), where metered
        return getattr(self.inner, "ticket", None)

    def __aiter__(self) -> AsyncIterator[EngineEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[EngineEvent]:
        measured = Measured()
        parts: list[str] = []
        done: DoneEvent | None = None
        async for event in self.inner:
            if isinstance(event, TokenEvent):
                measured.token()
                parts.append(event.text)
            elif isinstance(event, DoneEvent):
                done = event
                measured.done(event.usage.completion_tokens)
            yield event
        if done is None or done.finish_reason not in ("stop", "length", "content_filter"):
            return
        served = Served(
            self.user,
            self.model,
            self.messages,
            "".join(parts),
            done.finish_reason == "content_filter",
            measured.tokens,
            measured.ttft_s,
            measured.tokens_per_s,
            self.user.id,
        )
        await self.shadow.offer(served)

    def cancel(self) -> None:
        self.inner.cancel()


def mirrored(
    generation: Generation,
    shadow: ShadowTraffic | None,
    user: User | None,
    model: str,
    messages: tuple[ChatMessage, ...],
    plain: bool,
) -> Generation:
    """`generation`, offered to shadow traffic when done, if it can be: a user's single
    plain answer to chat messages (not n answers, tools or a raw prompt)."""
    if shadow is None or user is None or not plain or not messages or not shadow.rules:
        return generation
    return MirroredGeneration(generation, shadow, user, model, messages)


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known) / len(known), 4) if known else None


def summarise(
    key: tuple[str, str, str], rows: list[Comparison], outcomes: Mapping[tuple[str, str, str], int]
) -> dict[str, Any]:
    """One (tier, served model, candidate) pair's means over its recent comparisons."""
    tier, served, candidate = key
    n = len(rows)
    return {
        "tier": tier,
        "served_model": served,
        "candidate": candidate,
        "compared": n,
        "shed": outcomes.get((tier, candidate, "shed"), 0),
        "served_ttft_s": _mean([r.served_ttft_s for r in rows]),
        "shadow_ttft_s": _mean([r.shadow_ttft_s for r in rows]),
        "served_tokens_per_s": _mean([r.served_tokens_per_s for r in rows]),
        "shadow_tokens_per_s": _mean([r.shadow_tokens_per_s for r in rows]),
        "served_tokens": _mean([float(r.served_tokens) for r in rows]),
        "shadow_tokens": _mean([float(r.shadow_tokens) for r in rows]),
        "served_blocked_rate": round(sum(r.served_blocked for r in rows) / n, 4),
        "shadow_blocked_rate": round(sum(r.shadow_blocked for r in rows) / n, 4),
        "similarity": _mean([r.similarity for r in rows]),
    }
