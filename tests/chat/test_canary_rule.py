"""The canary decision rule on synthetic samples, driven by a fake clock: a slower canary is
rolled back, equal arms reach no decision until both have enough samples (then ready), an
error burst rolls back, and a canary worse on its eval score is held, naming the metric."""

from __future__ import annotations

import random

from chatbox.chat.canary import MIN_SAMPLES, Sample, Side, verdict
from chatbox.chat.policy import Canary

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
