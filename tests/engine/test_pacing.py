"""The prefill pacer keeps the mean step time within stall_ratio x a decode step."""

from __future__ import annotations

from chatbox.engine.pacing import PrefillPacer


def simulate(pacer: PrefillPacer, steps: int, decode: float, per_token: float) -> tuple[float, int]:
    """Run a fake workload: 4 decoders, an endless prompt. Return (mean step, tokens)."""
    total, prefilled = 0.0, 0
    for _ in range(steps):
        n = pacer.allowance(4, 10_000, 508)
        elapsed = decode + n * per_token
        pacer.observe(4, n, elapsed)
        total += elapsed
        prefilled += n
    return total / steps, prefilled


def test_mean_step_time_stays_within_ratio() -> None:
    pacer = PrefillPacer(capacity=512, stall_ratio=1.8, chunk=64)
    mean, prefilled = simulate(pacer, 2000, decode=0.050, per_token=0.007)
    assert mean <= 1.8 * 0.050 * 1.05
    assert prefilled > 0.9 * (0.8 * 0.050 / 0.007) * 2000 * 0.8  # most of the allowed rate


def test_cheap_prefill_goes_in_every_step() -> None:
    pacer = PrefillPacer(capacity=512, stall_ratio=1.8, chunk=64)
    mean, prefilled = simulate(pacer, 200, decode=0.050, per_token=0.0001)
    assert prefilled > 150 * 64 and mean < 1.8 * 0.050


def test_no_decoders_means_full_batches_and_nothing_waiting_means_none() -> None:
    pacer = PrefillPacer(capacity=512, stall_ratio=1.8)
    assert pacer.allowance(0, 3000, 512) == 512
    assert pacer.allowance(4, 0, 508) == 0


def test_disabled_pacing() -> None:
    pacer = PrefillPacer(capacity=256, stall_ratio=0)
    assert pacer.allowance(8, 3000, 248) == 248
