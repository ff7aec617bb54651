"""Admission and routing rules without HTTP: buckets, priorities, the overload order."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from chatbox.chat import Overloaded, RateLimited
from chatbox.chat.admission import Gatekeeper, Ticket, TokenBucket
from chatbox.chat.policy import Policy, default_policy_path
from chatbox.chat.routing import Router
from chatbox.engine.types import EngineStats, Usage
from chatbox.store import Store, User

POLICY: dict[str, Any] = {
    "tiers": {
        "free": {
            "rpm": 3,
            "tpm": 100,
            "max_streams": 5,
            "model": "small",
            "overload": "shed",
            "priority": 2,
        },
        "paid": {
            "rpm": 100,
            "tpm": 10000,
            "max_streams": 5,
            "model": "large",
            "fallback": "small",
            "overload": "degrade",
        },
    },
    "overload": {"high_water": 4, "degrade_factor": 2.0},
    "routing": {"small": "small", "large": "large", "auto_long_chars": 50},
}
FREE = User("u_free", "ann", "member", "free", False, 0.0)
PAID = User("u_paid", "bob", "member", "paid", False, 0.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def store(database: Path | str) -> Any:
    s = await Store.open(database)
    for user in (FREE, PAID):
        created = await s.users.create(user.name, tier=user.tier)
        object.__setattr__(user, "id", created.id)
    yield s
    await s.close()


def gate(store: Store, stats: dict[str, EngineStats], clock: Clock) -> Gatekeeper:
    policy = Policy.from_dict(POLICY)
    router = Router(policy, lambda: ["small", "large"], lambda: "small", random.Random(1))
    return Gatekeeper(policy, store.usage, router, stats.get, clock=clock)


def test_bucket_refills_continuously() -> None:
    b = TokenBucket(60, 0, 0.0)
    assert b.wait_for(1) == pytest.approx(1.0)
    b.refill(30.0)
    assert b.level == 30 and b.wait_for(1) == 0
    b.refill(1000.0)
    assert b.level == 60 and b.reset_s() == 0


def test_default_policy_file_parses() -> None:
    policy = Policy.load(default_policy_path())
    assert policy.tier("free").overload == "shed" and policy.tier("paid").overload == "degrade"
    assert policy.tier("unknown-tier").name == "free"  # undefined tiers get free limits


async def test_rpm_refills_and_tpm_is_charged_as_used(store: Store) -> None:
    clock = Clock()
    g = gate(store, {}, clock)
    tickets = [await g.admit(FREE, None, "hi") for _ in range(3)]
    with pytest.raises(RateLimited) as exc:
        await g.admit(FREE, None, "hi")
    assert exc.value.kind == "requests" and exc.value.retry_after == 20
    clock.now += 20
    for t in tickets:
        await t.finish(Usage(prompt_tokens=40, completion_tokens=10))
    with pytest.raises(RateLimited) as exc:  # 150 tokens used of 100 per minute
        await g.admit(FREE, None, "hi")
    assert exc.value.kind == "tokens"
    assert exc.value.headers["x-ratelimit-remaining-tokens"] == "0"


async def test_priorities_put_paid_first_and_extra_streams_behind(store: Store) -> None:
    g = gate(store, {}, Clock())
    free1, free2 = await g.admit(FREE, None, "a"), await g.admit(FREE, None, "b")
    paid1, paid2 = await g.admit(PAID, None, "a"), await g.admit(PAID, None, "b")
    assert (paid1.priority, paid2.priority, free1.priority, free2.priority) == (0, 1, 2, 3)


async def test_n_answers_count_as_n_streams(store: Store) -> None:
    """A request's n answers each take one of the tier's max_streams, released together."""
    g = gate(store, {}, Clock())
    with pytest.raises(RateLimited) as exc:
        await g.admit(PAID, None, "a", streams=6)  # more than the tier ever allows
    assert exc.value.kind == "streams" and "max_streams is 5" in str(exc.value)
    three = await g.admit(PAID, None, "a", streams=3)
    with pytest.raises(RateLimited) as exc:
        await g.admit(PAID, None, "b", streams=3)  # 3 + 3 > 5
    assert exc.value.kind == "streams" and "max_streams" in str(exc.value)
    two = await g.admit(PAID, None, "b", streams=2)  # 3 + 2 = 5
    with pytest.raises(RateLimited):
        await g.admit(PAID, None, "c")
    await three.finish(None)
    again = await g.admit(PAID, None, "c", streams=3)  # all three given back at once
    for ticket in (two, again):
        await ticket.finish(None)


async def test_overload_order_counts_running_and_waiting(store: Store) -> None:
    stats = {
        "small": EngineStats(running=3, queue_depth=0, slots_total=8),
        "large": EngineStats(running=3, queue_depth=0, slots_total=8),
    }
    g = gate(store, stats, Clock())
    assert (await g.admit(FREE, None, "x")).model == "small"  # 3 < high water 4
    stats["small"] = EngineStats(running=4, queue_depth=0, slots_total=8)
    with pytest.raises(Overloaded):
        await g.admit(FREE, None, "x")
    stats["large"] = EngineStats(running=8, queue_depth=0, slots_total=8)
    ticket = await g.admit(PAID, None, "x")
    assert ticket.model == "small" and ticket.route.degraded_from == "large"
    stats["small"] = EngineStats(running=8, queue_depth=1, slots_total=8)
    assert (await g.admit(PAID, None, "x")).model == "large"  # both full: queue


async def test_requests_admitted_a_moment_ago_count_before_their_engine_reports_them(
    store: Store,
) -> None:
    """A burst arrives faster than the engine's figures move (each request is still at its
    moderation check): the high-water mark holds anyway, and a finished request makes room."""
    stats = {m: EngineStats(running=0, queue_depth=0, slots_total=8) for m in ("small", "large")}
    policy = Policy.from_dict(POLICY)
    router = Router(policy, lambda: ["small", "large"], lambda: "small", random.Random(1))
    g = Gatekeeper(policy, store.usage, router, stats.get, high_water=2, clock=Clock())
    burst = await asyncio.gather(
        *(g.admit(FREE, None, text) for text in "abc"), return_exceptions=True
    )
    admitted = [t for t in burst if isinstance(t, Ticket)]
    assert len(admitted) == 2 and sum(isinstance(t, Overloaded) for t in burst) == 1, burst
    await admitted[0].finish(None)
    again = await g.admit(FREE, None, "c")  # the shed request's rpm was given back
    for ticket in (admitted[1], again):
        await ticket.finish(None)
    assert (await g.admit(PAID, None, "d")).model == "large"


def test_auto_routes_by_shape() -> None:
    policy = Policy.from_dict(POLICY)
    router = Router(policy, lambda: ["small", "large"], lambda: "small")
    assert router.route(PAID, "auto", "hello").model == "small"
    assert router.route(PAID, "auto", "x" * 60).model == "large"
    assert router.route(PAID, "auto", "```\nprint(1)\n```").model == "large"


def test_picker_shows_the_model_that_will_answer() -> None:
    """With no pick, each tier sees its own default; a pick is shown when the tier may use it."""
    policy = Policy.from_dict(
        {
            **POLICY,
            "tiers": {**POLICY["tiers"], "free": {**POLICY["tiers"]["free"], "models": ["small"]}},
        }
    )
    router = Router(policy, lambda: ["small", "large"], lambda: "small")
    assert router.expected(PAID, None) == router.route(PAID, None).model == "large"
    assert router.expected(FREE, None) == router.route(FREE, None).model == "small"
    assert router.expected(PAID, "small") == "small"
    assert router.expected(FREE, "large") == router.route(FREE, "large").model == "small"
    assert router.expected(PAID, "auto") == "small"
