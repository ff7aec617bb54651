"""Step costs by size: what guessed rows add to a step, from measured steps only."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from chatbox.engine.engine import LlamaEngine
from chatbox.engine.speculative.stepcost import StepCosts
from chatbox.engine.types import GenerationRequest, SamplingParams
from tests.engine.conftest import TINY_SETTINGS
from tests.engine.helpers import chat, collect


def test_a_ratio_needs_both_sizes_measured_at_the_same_depth() -> None:
    c = StepCosts()
    assert c.ratio(1, 1, 1, 100) is None
    c.observe(1, 1, 100, 0.007)
    assert c.ratio(1, 1, 1, 100) is None  # 2-token steps not seen yet
    c.observe(2, 1, 100, 0.015)
    assert c.ratio(1, 1, 1, 100) == 0.015 / 0.007
    assert c.ratio(1, 1, 1, 3000) is None  # a deep step is another class
    c.observe(2, 2, 100, 0.030)  # two sequences are not one sequence with a guess
    assert c.ratio(1, 1, 1, 100) == 0.015 / 0.007
    for _ in range(40):  # the box got slower: the average follows
        c.observe(2, 1, 100, 0.021)
    ratio = c.ratio(1, 1, 1, 100)
    assert ratio is not None and abs(ratio - 3.0) < 0.01
    c.observe(200, 1, 100, 0.5)  # a prefill step: not kept
    assert c.ratio(1, 1, 199, 100) is None


async def test_the_scheduler_learns_step_costs_from_its_own_steps(tiny_gguf: Path) -> None:
    # Guesses off: the tiny model's random answer repeats an n-gram now and then, and a
    # guess would add a two-row step by chance.
    engine = LlamaEngine(tiny_gguf, "tiny", replace(TINY_SETTINGS, lookup_draft=0))
    await engine.start()
    try:
        req = GenerationRequest(chat("hello there"), SamplingParams(max_tokens=12))
        await collect(engine.submit(req, ignore_eog=True))
        one = await engine.debug_call(lambda s: s.costs.ratio(1, 1, 0, 64))
        two = await engine.debug_call(lambda s: s.costs.ratio(1, 1, 1, 64))
    finally:
        await engine.stop()
        engine.close()
    assert one == 1.0  # one-token steps were timed (a ratio to themselves)
    assert two is None  # no step of two rows in one sequence ran: nothing to compare
