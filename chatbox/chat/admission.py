"""Admission before any engine work (the Gatekeeper): budgets, token buckets, fair share,
the overload order.

The buckets and open-stream counts live in the store's counters: this process's on SQLite,
rows every front shares on PostgreSQL (chatbox/store/limits.py)."""

from __future__ import annotations

import asyncio
import calendar
import math
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from chatbox.chat.errors import Overloaded, RateLimited
from chatbox.chat.policy import Policy, TierPolicy
from chatbox.chat.routing import Route, Router
from chatbox.chat.running.runs import TurnRun
from chatbox.engine.types import EngineStats, Usage
from chatbox.observability import Telemetry
from chatbox.store import User
from chatbox.store.limits import Counters, MemoryCounters, Spend
from chatbox.store.usage import UsageRepo, day_of

Clock = Callable[[], float]


@dataclass
class TokenBucket:
    """`capacity` per minute, refilled continuously; the level may go below zero (debt)."""

    capacity: float
    level: float
    updated: float

    @property
    def rate(self) -> float:
        return self.capacity / 60.0

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
        self.updated = now

    def wait_for(self, amount: float) -> float:
        """Seconds until `amount` is available (0 when it is now)."""
        need = min(amount, self.capacity) - self.level
        return 0.0 if need <= 0 else need / self.rate

    def reset_s(self) -> float:
        """Seconds until the bucket is full again."""
        return max(0.0, (self.capacity - self.level) / self.rate) if self.rate else 0.0


@dataclass
class Ticket:
    """An admitted request; `finish` charges what it actually used, exactly once."""

    user: User
    route: Route
    estimate: int
    priority: int
    gatekeeper: Gatekeeper
    seq: int = 0
    lease: str | None = None  # the user's open-stream lease, released by `finish`
    tokens: Spend | None = None  # what the tokens bucket was charged (None: no tpm)
    done: bool = False
    started: bool = False  # its first token has come: it is no longer waiting
    admitted_at: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    outcome: str = ""  # error | refused | filtered, set by the path that saw it ("" fine)
    load: int | None = None  # requests already in its engine when it was admitted
    open: bool = False  # counted among its model's open requests until `finish`

    @property
    def model(self) -> str:
        return self.route.model

    def mark_started(self) -> None:
        if not self.started:
            self.started = True
            self.first_token_at = time.monotonic()
            self.gatekeeper.unqueue(self)

    def position(self) -> int:
        """1-based place in the engine's queue; 0 once it runs (or when unknown)."""
        return 0 if self.started or self.done else self.gatekeeper.position(self)

    async def finish(self, usage: Usage | None, later: bool = False) -> None:
        """Release what admission took and meter `usage`; `later`: the usage write is not
        waited for (reads of usage still see it)."""
        if self.done:
            return
        self.done = True
        self.gatekeeper.unqueue(self)
        self.gatekeeper.close(self)
        try:
            await self.gatekeeper.settle(self, usage, later)
        except BaseException:
            self.done = False  # the store away: a later `finish` settles what is left
            raise


@dataclass
class Gatekeeper:
    """Decides, per request, whether it runs, on which model, or why not (429 / 503)."""

    policy: Policy
    usage: UsageRepo
    router: Router
    stats: Callable[[str], EngineStats | None]  # an engine's load; None while not loaded
    high_water: int = 0  # overrides the policy's high-water mark when > 0
    clock: Clock = time.monotonic
    wall: Clock = time.time  # the time usage is counted at (a replay's clock in benchmarks)
    telemetry: Telemetry = field(default_factory=Telemetry.off)  # counts each decision
    # Each settled request (canary verdicts compare the arms): ticket, usage, monotonic end.
    on_settle: Callable[[Ticket, Usage | None, float], None] | None = None
    counters: Counters | None = None  # None: this process's, on `clock`
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _waiting: dict[str, list[Ticket]] = field(default_factory=dict)  # by model, no token yet
    _open: dict[str, int] = field(default_factory=dict)  # by model: admitted, not finished
    _seq: int = 0

    # -- state --------------------------------------------------------------------------

    def __post_init__(self) -> None:
        if self.counters is None:
            self.counters = MemoryCounters(self.clock)

    @property
    def _counters(self) -> Counters:
        assert self.counters is not None
        return self.counters

    def headers(self, user: User) -> dict[str, str]:
        """x-ratelimit-{limit,remaining,reset}-{requests,tokens} for this user now."""
        tier = self.policy.tier(user.tier)
        out: dict[str, str] = {}
        for name, limit in (("requests", tier.rpm), ("tokens", tier.tpm)):
            if limit <= 0:
                continue
            level = self._counters.peek(_bucket_key(user, name, limit), limit)
            b = TokenBucket(limit, level, 0.0)
            out[f"x-ratelimit-limit-{name}"] = str(int(b.capacity))
            out[f"x-ratelimit-remaining-{name}"] = str(max(0, math.floor(b.level)))
            out[f"x-ratelimit-reset-{name}"] = f"{math.ceil(b.reset_s())}s"
        return out

    def high_water_for(self, stats: EngineStats) -> int:
        hw = self.high_water or self.policy.overload.high_water or stats.slots_total
        return max(1, hw)

    # -- admission ----------------------------------------------------------------------

    def check_streams(self, user: User, answers: int, asked: str) -> None:
        """RateLimited (429) where one request asks for more answers at once than the
        user's tier may have generating (`max_streams`): `asked` says how ("n=8")."""
        tier = self.policy.tier(user.tier)
        if answers <= tier.max_streams:
            return
        self.telemetry.admission(tier.name, "rate_limited", "streams")
        raise RateLimited(
            f"this request asks for {answers} answers at once ({asked}); the {tier.name} "
            f"tier's max_streams is {tier.max_streams}: ask for fewer",
            1,
            self.headers(user),
            "streams",
        )

    async def admit(self, user: User, requested: str | None, text: str, streams: int = 1) -> Ticket:
        """Admit or refuse a request of `streams` answers generated at once (n); raises
        RateLimited (429) or Overloaded (503)."""
        self.check_streams(user, streams, f"n={streams}")
        tier = self.policy.tier(user.tier).name  # a policy's tier: a small, fixed set
        with self.telemetry.span("admission", **{"chatbox.tier": tier}) as span:
            try:
                ticket = await self._admit(user, requested, text, streams)
            except RateLimited as exc:
                self.telemetry.admission(tier, "rate_limited", exc.kind)
                span.set_attribute("chatbox.decision", "rate_limited")
                raise
            except Overloaded:
                self.telemetry.admission(tier, "shed")
                span.set_attribute("chatbox.decision", "shed")
                raise
            decision = (
                "degraded"
                if ticket.route.degraded_from
                else "queued"
                if ticket.position() > 0
                else "admitted"
            )
            self.telemetry.admission(tier, decision)
            span.set_attributes({"chatbox.decision": decision, "chatbox.model": ticket.model})
            return ticket

    async def _admit(self, user: User, requested: str | None, text: str, streams: int) -> Ticket:
        tier = self.policy.tier(user.tier)
        route = self.router.route(user, requested, text)  # UnknownModel before any charge
        await self._check_budget(user, tier)
        estimate = max(1, len(text) // 4)
        spends = {
            kind: Spend(_bucket_key(user, kind, limit), limit, amount)
            for kind, limit, amount in (
                ("requests", tier.rpm, 1.0),
                ("tokens", tier.tpm, float(estimate)),
            )
            if limit > 0
        }
        # Buckets and the stream slots are taken together, or none of them (every front's).
        taken = await self._counters.take(
            list(spends.values()), (user.id, tier.max_streams), streams
        )
        for kind, spend in spends.items():
            if taken.refused == spend.key:
                level = taken.levels[spend.key]
                wait = TokenBucket(spend.capacity, level, 0.0).wait_for(spend.amount)
                raise RateLimited(
                    f"rate limit reached: {int(spend.capacity)} {kind} per minute on the "
                    f"{tier.name} tier; retry in {math.ceil(wait)} s",
                    math.ceil(wait),
                    self.headers(user),
                    kind,
                )
        if taken.refused == "streams":
            more = "" if streams == 1 else f" and this request asks for {streams} more"
            raise RateLimited(
                f"{taken.streams} answers are already being written for you{more} (the "
                f"{tier.name} tier's max_streams allows {tier.max_streams} at once); wait for "
                "one to finish",
                2,
                self.headers(user),
                "streams",
            )
        try:
            route = await self._overload(user, tier, route)
        except BaseException:  # refused for load: nothing of the user's is spent
            for spend in spends.values():
                await self._counters.give(spend.key, spend.capacity, spend.amount)
            if taken.lease is not None:
                await self._counters.release(taken.lease)
            raise
        # Tiers first (paid before free), then fair share: a user's extra streams queue
        # behind everyone else's first ones. Background work (>= 10) stays behind all.
        priority = min(9, tier.priority + taken.streams)
        self._seq += 1
        ticket = Ticket(user, route, estimate, priority, self, self._seq, taken.lease)
        ticket.tokens = spends.get("tokens")
        stats = self.stats(route.model)
        ticket.load = load(stats) if stats is not None else None
        self._waiting.setdefault(route.model, []).append(ticket)
        # Counted in the same step as `_overload` let it through: the next admission sees it.
        self._open[route.model] = self._open.get(route.model, 0) + 1
        ticket.open = True
        return ticket

    def close(self, ticket: Ticket) -> None:
        """A finished ticket no longer counts against its model's high-water mark."""
        if ticket.open:
            ticket.open = False
            self._open[ticket.model] -= 1

    def waiting(self) -> int:
        """Admitted requests that have no token yet (queued, or not yet at their engine)."""
        return sum(len(tickets) for tickets in self._waiting.values())

    def unqueue(self, ticket: Ticket) -> None:
        waiting = self._waiting.get(ticket.model)
        if waiting is not None and ticket in waiting:
            waiting.remove(ticket)

    def position(self, ticket: Ticket) -> int:
        """Where a not-yet-started request stands in its engine's queue (0: running).

        The engine runs waiting requests by (priority, arrival); the first ones of those
        without a token yet are prefilling in a slot, the rest are the engine's queue.
        """
        stats = self.stats(ticket.model)
        waiting = sorted(self._waiting.get(ticket.model, []), key=lambda t: (t.priority, t.seq))
        if stats is None or ticket not in waiting:
            return 0
        in_slots = len(waiting) - stats.queue_depth
        return max(0, waiting.index(ticket) - in_slots + 1)

    async def _check_budget(self, user: User, tier: TierPolicy) -> None:
        now = time.time()
        for budget, since, period in (
            (tier.daily_tokens, day_of(now), "daily"),
            (tier.monthly_tokens, day_of(now)[:8] + "01", "monthly"),
        ):
            if budget <= 0:
                continue
            used = await self.usage.tokens_since(user.id, since)
            if used >= budget:
                wait = _seconds_to_next(period, now)
                raise RateLimited(
                    f"the {tier.name} tier's {period} budget of {budget} tokens is used up",
                    wait,
                    self.headers(user),
                    "budget",
                )

    async def _overload(self, user: User, tier: TierPolicy, route: Route) -> Route:
        """Past the high-water mark: shed, then degrade, then queue — in that order.

        The mark counts requests in the engine (running + waiting); by default it is the
        slot count, so "shed" tiers get a slot at once or a 503; a lower mark keeps slots
        free for the other tiers. What the engine reports lags: a request admitted a moment
        ago may still be at its moderation check or in the engine's inbox, so the requests
        this gatekeeper admitted and that have not finished count too (the larger of the
        two), or a burst of arrivals would all pass before the first reached the engine.
        """
        stats = self.stats(route.model)
        if stats is None:
            return route
        hw = self.high_water_for(stats)
        depth = self._depth(route.model, stats)
        retry = self.policy.overload.retry_after_s
        if depth >= hw and tier.overload == "shed":
            await self.usage.record(
                user.id, route.model, requests=0, shed=1, arm=route.arm, ts=self.wall()
            )
            raise Overloaded(f"the server is busy; please retry in {retry} s", retry)
        degrade_at = hw * self.policy.overload.degrade_factor
        fallback = tier.fallback
        if (
            depth >= degrade_at
            and tier.overload == "degrade"
            and fallback
            and fallback != route.model
            and fallback in self.router.names()
        ):
            small = self.stats(fallback)
            if small is None or self._depth(fallback, small) < degrade_at:
                return route.degrade(fallback)
        return route

    def _depth(self, model: str, stats: EngineStats) -> int:
        """Requests in a model's engine, or admitted to it and not finished if more."""
        return max(load(stats), self._open.get(model, 0))

    async def settle(self, ticket: Ticket, usage: Usage | None, later: bool = False) -> None:
        used = usage.prompt_tokens + usage.completion_tokens if usage else 0
        # Each step done is forgotten, so settling again after an outage repeats none.
        if ticket.lease is not None:
            await self._counters.release(ticket.lease)
            ticket.lease = None
        if ticket.tokens is not None:  # charge what was really used, not the estimate
            spend = ticket.tokens
            await self._counters.give(spend.key, spend.capacity, ticket.estimate - used)
            ticket.tokens = None
        route = ticket.route
        counts: dict[str, Any] = {
            "prompt": usage.prompt_tokens if usage else 0,
            "completion": usage.completion_tokens if usage else 0,
            "cached": usage.cached_tokens if usage else 0,
            "degraded": int(route.degraded_from is not None),
            "arm": route.arm,
            "ts": self.wall(),
        }
        if later:
            self.usage.record_soon(ticket.user.id, route.model, **counts)
        else:
            await self.usage.record(ticket.user.id, route.model, **counts)
        if self.on_settle is not None:
            self.on_settle(ticket, usage, time.monotonic())

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def load(stats: EngineStats) -> int:
    """Requests in the engine: running in a slot or waiting for one."""
    return stats.running + stats.queue_depth


def _bucket_key(user: User, kind: str, limit: int) -> str:
    """A user's bucket of one limit; a tier change (another limit) starts a full one."""
    return f"{user.id}:{kind}:{limit}"


def _seconds_to_next(period: str, now: float) -> int:
    """Seconds until the next UTC day (daily) or calendar month (monthly) begins."""
    t = time.gmtime(now)
    if period == "daily":
        return int(calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0)) + 86400 - now) + 1
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    return int(calendar.timegm((year, month, 1, 0, 0, 0)) - now) + 1


def route_out(ticket: Ticket) -> dict[str, object]:
    """How the model was chosen, for the answer's events (shown with every answer)."""
    route = ticket.route
    out: dict[str, object] = {"route": route.reason}
    if route.arm:
        out["arm"] = route.arm
    if route.degraded_from:
        out["degraded_from"] = route.degraded_from
        out["notice"] = (
            f"The server is busy, so {route.model} answered instead of {route.degraded_from}."
        )
    return out


async def announce_queue(run: TurnRun, ticket: Ticket, every_s: float = 0.5) -> None:
    """While the answer waits for a slot, publish its place in line whenever it changes."""
    last = next((e.data["position"] for e in reversed(run.events) if e.kind == "queued"), 0)
    while not ticket.started and not ticket.done:
        position = ticket.position()
        if position != last and position > 0:
            run.publish("queued", {"position": position})
        last = position
        await asyncio.sleep(every_s)
