"""The prefill pacer keeps the mean step time within stall_ratio x a decode step."""

from __future__ import annotations

from chatbox.engine.job import Job
from chatbox.engine.pacing import PROTECT_AFTER, PrefillPacer, prefill_budget
from chatbox.engine.types import ChatMessage, GenerationRequest, SamplingParams


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


def job(priority: int, prompt: int = 0, generated: int = 0) -> Job:
    request = GenerationRequest((ChatMessage("user", "x"),), SamplingParams(), priority=priority)
    return Job(request=request, prompt=[1] * prompt, sink=lambda _: None, n_generated=generated)


def trained_pacer() -> PrefillPacer:
    """A pacer that has seen decode steps of 50 ms and prompt tokens of 7 ms."""
    pacer = PrefillPacer(capacity=512, stall_ratio=1.6, chunk=64)
    simulate(pacer, 50, decode=0.050, per_token=0.007)
    return pacer


def test_an_urgent_prompt_is_not_paced_behind_less_urgent_streams() -> None:
    free_streams = [job(2, generated=PROTECT_AFTER + 5) for _ in range(3)]
    paid, free = job(0, prompt=300), job(2, prompt=300)
    # A paid prompt while only free answers run: all of it now, none of the free prompt.
    assert prefill_budget(trained_pacer(), free_streams, [paid, free], 500) == 300
    # Room still limits it.
    assert prefill_budget(trained_pacer(), free_streams, [paid, free], 120) == 120


def test_prompts_are_paced_behind_streams_as_urgent_as_they_are() -> None:
    streams = [job(0, generated=PROTECT_AFTER + 5), job(2, generated=PROTECT_AFTER + 5)]
    pacer = trained_pacer()
    # Paced: chunks no bigger than the configured 64, and some steps carry none.
    budgets = [prefill_budget(pacer, streams, [job(0, prompt=300)], 500) for _ in range(20)]
    assert max(budgets) <= 64 and 0 in budgets
    # A free prompt behind free streams is paced the same way.
    free_streams = [job(2, generated=PROTECT_AFTER + 5)]
    pacer = trained_pacer()
    assert (
        max(prefill_budget(pacer, free_streams, [job(2, prompt=300)], 500) for _ in range(20)) <= 64
    )


def test_new_streams_are_not_shielded_yet() -> None:
    burst = [job(2, generated=1) for _ in range(4)]
    assert prefill_budget(trained_pacer(), burst, [job(2, prompt=300)], 500) == 500
