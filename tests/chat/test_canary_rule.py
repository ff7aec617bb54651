"""The canary decision rule on synthetic samples, driven by a fake clock: a slower canary is
rolled back, equal arms reach no decision until both have enough samples (then ready), an
error burst rolls back, and a canary worse on its eval score is held, naming the metric."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from chatbox.accounts import AuditLog
from chatbox.accounts.audit import Actor
from chatbox.chat.policy import Canary, Policy
from chatbox.chat.rollout.canary import MIN_SAMPLES, CanaryService, Sample, Side, verdict
from chatbox.chat.routing import Router
from chatbox.store import Store, User

CANARY = Canary("free", "next", 10.0, "next-arm")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, s: float) -> float:
        self.now += s
        return self.now


def feed(
    side: Side,
    clock: FakeClock,
    n: int,
    rng: random.Random,
    arm: str = "",
    ttft: float = 0.2,
    tps: float = 40.0,
    error_rate: float = 0.0,
) -> None:
    for _ in range(n):
        error = rng.random() < error_rate
        side.samples.append(
            Sample(
                clock.advance(1.0),
                "free",
                arm,
                None if error else ttft * rng.uniform(0.8, 1.25),
                None if error else tps * rng.uniform(0.8, 1.25),
                error=error,
                length=rng.randint(20, 200),
            )
        )


def test_a_slower_canary_is_rolled_back_naming_the_latency() -> None:
    rng, clock = random.Random(1), FakeClock()
    arm, base = Side(), Side()
    feed(base, clock, 200, rng)
    feed(arm, clock, 200, rng, arm="next-arm", ttft=0.5)  # 2.5x the time to first token
    v = verdict(CANARY, arm, base, clock())
    assert v.verdict == "rollback"
    assert v.deciding == "ttft"
    assert "ttft worse by" in v.reason
    ttft = next(c for c in v.metrics if c.metric == "ttft")
    assert ttft.low > ttft.threshold  # the interval lies wholly beyond the threshold
    assert ttft.quantiles["arm"]["p50"]["value"] > ttft.quantiles["baseline"]["p99"]["value"]
    # The interval as an admin reads it: a ratio's in percent, a rate's in points.
    low, high = ttft.as_dict()["shown_interval"]
    assert low.endswith("%") and high.endswith("%") and 100 < int(low[1:-1]) < int(high[1:-1])
    errors = next(c for c in v.metrics if c.metric == "error_rate").as_dict()
    assert all(x.endswith(" pts") for x in errors["shown_interval"])


def test_equal_arms_decide_nothing_until_enough_samples_then_are_ready() -> None:
    rng, clock = random.Random(2), FakeClock()
    arm, base = Side(), Side()
    feed(base, clock, MIN_SAMPLES - 1, rng)
    feed(arm, clock, MIN_SAMPLES - 1, rng, arm="next-arm")
    early = verdict(CANARY, arm, base, clock())
    assert early.verdict == "collecting"
    assert f"needs {MIN_SAMPLES}" in early.reason
    feed(base, clock, 1, rng)
    feed(arm, clock, 1, rng, arm="next-arm")
    assert verdict(CANARY, arm, base, clock()).verdict in ("continue", "ready")
    feed(base, clock, 1500, rng)
    feed(arm, clock, 1500, rng, arm="next-arm")
    late = verdict(CANARY, arm, base, clock())
    assert late.verdict == "ready", late.reason
    assert all(c.outcome in ("ok", "few", "info") for c in late.metrics)


def feed_loaded(
    side: Side, clock: FakeClock, n: int, rng: random.Random, loads: range, arm: str = ""
) -> None:
    """One model's answers under engine load: each request already in the engine adds a
    tenth of a second to the time to first token and slows decoding alike on both arms."""
    for _ in range(n):
        load = rng.choice(loads)
        side.samples.append(
            Sample(
                clock.advance(1.0),
                "free",
                arm,
                0.1 * (1 + load) * rng.uniform(0.8, 1.25),
                40.0 / (1 + 0.3 * load) * rng.uniform(0.8, 1.25),
                length=rng.randint(20, 200),
                load=load,
            )
        )


@pytest.mark.parametrize("seed", range(5))
def test_an_a_a_canary_on_a_busier_engine_reaches_no_false_verdict(seed: int) -> None:
    rng, clock = random.Random(seed), FakeClock()
    arm, base = Side(), Side()
    # The same model on both arms; the canary's engine is the busier one (loads 2-9
    # against 0-5), so its raw time to first token is about twice the baseline's.
    for _ in range(20):
        feed_loaded(base, clock, 100, rng, range(0, 6))
        feed_loaded(arm, clock, 100, rng, range(2, 10), arm="next-arm")
        v = verdict(CANARY, arm, base, clock())
        assert v.verdict not in ("rollback", "hold"), v.reason
    raw = [s.ttft_s or 0 for s in arm.samples], [s.ttft_s or 0 for s in base.samples]
    assert sum(raw[0]) / len(raw[0]) > 1.5 * sum(raw[1]) / len(raw[1])
    ttft = next(c for c in v.metrics if c.metric == "ttft")
    assert abs(ttft.worsening) < 0.1  # under alike load the two are alike
    assert ttft.arm.n < len(arm.samples)  # only answers under a load both arms saw count


def test_an_undecided_verdict_says_how_many_more_answers_it_needs() -> None:
    rng, clock = random.Random(6), FakeClock()
    arm, base = Side(), Side()
    feed(base, clock, 10, rng)
    feed(arm, clock, 10, rng, arm="next-arm")
    early = verdict(CANARY, arm, base, clock())
    assert early.verdict == "collecting"
    assert early.more_needed is not None and early.more_needed >= MIN_SAMPLES - 10
    assert f"needs ~{early.more_needed} more answers a side to decide" in early.reason
    feed(base, clock, 40, rng)
    feed(arm, clock, 40, rng, arm="next-arm")
    v = verdict(CANARY, arm, base, clock())
    if v.verdict == "continue":
        assert v.more_needed is not None and f"needs ~{v.more_needed} more" in v.reason
        # Feeding that many more (as the estimate assumes, alike arms) decides it.
        feed(base, clock, 2 * v.more_needed, rng)
        feed(arm, clock, 2 * v.more_needed, rng, arm="next-arm")
        assert verdict(CANARY, arm, base, clock()).verdict == "ready"
    assert v.as_dict()["more_needed"] == v.more_needed


def test_an_error_burst_rolls_the_canary_back() -> None:
    rng, clock = random.Random(3), FakeClock()
    arm, base = Side(), Side()
    feed(base, clock, 300, rng, error_rate=0.005)
    feed(arm, clock, 60, rng, arm="next-arm")
    assert verdict(CANARY, arm, base, clock()).verdict != "rollback"
    feed(arm, clock, 40, rng, arm="next-arm", error_rate=0.6)  # a burst of failures
    v = verdict(CANARY, arm, base, clock())
    assert v.verdict == "rollback"
    assert v.deciding == "error_rate"


def test_a_canary_worse_on_its_eval_score_is_held_naming_the_metric() -> None:
    rng, clock = random.Random(4), FakeClock()
    arm, base = Side(), Side()
    feed(base, clock, 200, rng)
    feed(arm, clock, 200, rng, arm="next-arm")
    for _ in range(200):
        base.scores.append((clock.advance(1), min(1.0, rng.gauss(0.8, 0.1))))
        arm.scores.append((clock.advance(1), min(1.0, rng.gauss(0.55, 0.1))))
    v = verdict(CANARY, arm, base, clock())
    assert v.verdict == "hold"
    assert v.deciding == "eval_score"
    assert "eval_score worse by" in v.reason


def test_samples_before_the_window_do_not_count() -> None:
    rng, clock = random.Random(5), FakeClock()
    arm, base = Side(), Side()
    feed(base, clock, 200, rng)
    feed(arm, clock, 200, rng, arm="next-arm", ttft=0.6)
    resumed = clock.advance(1)
    assert verdict(CANARY, arm, base, clock(), since=resumed).verdict == "collecting"


# -- the service: decisions on a fake clock, stored, audited and obeyed by routing ----------


async def _service(database: Path | str, clock: FakeClock) -> tuple[CanaryService, Store]:
    store = await Store.open(database)
    policy = Policy.from_dict(
        {
            "tiers": {"free": {"model": "base"}},
            "routing": {"canary": [{"tier": "free", "model": "next", "percent": 50, "arm": "nx"}]},
        }
    )
    return CanaryService(store, policy, AuditLog(store), clock=clock), store


def _traffic(service: CanaryService, clock: FakeClock, rng: random.Random, slow: float) -> None:
    for i in range(400):
        arm = "nx" if i % 2 else ""
        ttft = 0.2 * (slow if arm else 1.0) * rng.uniform(0.8, 1.25)
        service.observe(Sample(clock.advance(30), "free", arm, ttft, 40.0, length=50))


async def test_a_slow_canary_is_rolled_back_on_its_own_audited_and_routed_around(
    database: Path | str,
) -> None:
    clock = FakeClock()
    service, store = await _service(database, clock)
    try:
        service.started = clock()
        _traffic(service, clock, random.Random(6), slow=3.0)
        [v] = await service.tick()
        assert v.verdict == "rollback" and v.deciding == "ttft"
        assert service.state("nx") == "rolled_back"
        [event] = await store.canaries.events("nx")
        assert (event.action, event.automatic, event.at) == ("rollback", True, clock())
        [entry] = await store.audit.list(10, action="canary.rollback")
        assert entry.actor_name == "chatbox" and entry.detail["automatic"] is True
        assert "ttft worse" in entry.detail["reason"]
        router = Router(service.policy, lambda: ["base", "next"], lambda: "base")
        router.canary_state = service.state
        ann = User("u1", "ann", "member", "free", False, 0.0)
        assert {router.route(ann, None).model for _ in range(50)} == {"base"}
        await service.tick()  # decided once: no second rollback
        assert len(await store.canaries.events("nx")) == 1
        stored = await store.canaries.verdicts()
        assert stored["nx"].verdict == "rollback"
    finally:
        await store.close()


async def test_an_admin_promotes_and_the_tier_routes_to_the_canary(database: Path | str) -> None:
    clock = FakeClock()
    service, store = await _service(database, clock)
    try:
        _traffic(service, clock, random.Random(7), slow=1.0)
        [v] = await service.tick()
        assert v.verdict in ("continue", "ready")
        assert service.state("nx") == "running"
        await service.promote(Actor(None, "cli:test"), "nx", "looks good")
        router = Router(service.policy, lambda: ["base", "next"], lambda: "base")
        router.canary_state = service.state
        ann = User("u1", "ann", "member", "free", False, 0.0)
        routes = {(r.model, r.reason, r.arm) for r in (router.route(ann, None) for _ in range(20))}
        assert routes == {("next", "tier", "")}
        [entry] = await store.audit.list(10, action="canary.promote")
        assert entry.actor_name == "cli:test" and entry.detail["reason"] == "looks good"
        with pytest.raises(LookupError):
            await service.rollback(Actor(None, "cli:test"), "no-such-arm")
    finally:
        await store.close()


async def test_live_answers_are_graded_only_where_the_tier_opted_in_and_content_is_kept(
    database: Path | str,
) -> None:
    import asyncio

    store = await Store.open(database)
    graded: list[str] = []
    zero: set[str] = {"zed"}

    async def grade(
        judge: str, question: str, answer: str, reference: str = "", rubric: str = ""
    ) -> float:
        graded.append(question)
        return 0.5

    async def keeps_nothing(user: User) -> bool:
        return user.name in zero

    canary = {"tier": "free", "model": "next", "percent": 50, "arm": "nx"}
    try:
        for opted, expect in ((0, []), (100, ["q-ann"])):
            graded.clear()
            policy = Policy.from_dict(
                {"routing": {"canary": [{**canary, "judge": "big", "eval_percent": opted}]}}
            )
            service = CanaryService(
                store, policy, AuditLog(store), grade=grade, keeps_nothing=keeps_nothing
            )
            for name in ("ann", "zed"):
                user = User(name, name, "member", "free", False, 0.0)
                service.sample_live(user, "nx", f"q-{name}", "an answer")
            await asyncio.gather(*service._jobs)
            assert graded == expect  # zed keeps nothing: never graded
            assert len(service.sides.arm("nx").scores) == len(expect)
    finally:
        await store.close()


async def test_settled_requests_become_samples_of_their_arm_or_the_baseline(
    database: Path | str,
) -> None:
    from chatbox.chat.admission import Ticket
    from chatbox.chat.routing import Route
    from chatbox.engine.types import Usage

    clock = FakeClock()
    service, store = await _service(database, clock)
    ann = User("u1", "ann", "member", "free", False, 0.0)
    paid = User("u2", "pat", "member", "paid", False, 0.0)

    def ticket(route: Route, user: User = ann, outcome: str = "") -> Ticket:
        t = Ticket(user, route, 0, 0, gatekeeper=None)  # type: ignore[arg-type]
        t.admitted_at, t.first_token_at, t.outcome = 10.0, 10.5, outcome
        return t

    try:
        service.settled(ticket(Route("next", "canary", "nx")), Usage(5, 11, 0), 11.5)
        service.settled(ticket(Route("base", "tier")), Usage(5, 3, 0), 12.0)
        service.settled(ticket(Route("base", "tier"), outcome="refused"), None, 12.0)
        service.settled(ticket(Route("next", "canary", "nx"), outcome="error"), Usage(5, 0, 0), 12)
        service.settled(ticket(Route("base", "picked")), Usage(5, 3, 0), 12.0)  # not compared
        service.settled(ticket(Route("base", "tier")), None, 12.0)  # nothing ran: no sample
        service.settled(ticket(Route("base", "tier"), paid), Usage(5, 3, 0), 12.0)  # no canary
        arm = list(service.sides.arm("nx").samples)
        base = list(service.sides.baseline("free").samples)
        assert [(s.ttft_s, s.tokens_per_s, s.error, s.length) for s in arm] == [
            (0.5, 10.0, False, 11),
            (0.5, None, True, 0),
        ]
        # The message moderation refused before any model ran is no sample of either side.
        assert [(s.refused, s.length) for s in base] == [(False, 3)]
        assert "paid" not in service.sides.baselines
    finally:
        await store.close()
