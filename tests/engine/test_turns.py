"""The next turn's template tokens are decoded while the conversation sits idle (turns.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

from chatbox.engine.engine import LlamaEngine
from chatbox.engine.scheduler import Scheduler
from chatbox.engine.turns import GRACE_S
from chatbox.engine.types import SamplingParams
from chatbox.settings import EngineSettings
from tests.engine.helpers import assert_kv_consistent, chat, generate, softmax, wait_idle

CHATML_SEPARATOR = "<|im_end|>\n<|im_start|>user\n"
PAUSE = GRACE_S + 0.4  # a person reading the answer


def tokens(engine: LlamaEngine, text: str) -> list[int]:
    return engine.model.tokenize(text, add_special=False, parse_special=True)


async def test_the_separator_is_the_templates_turn_marker(tiny_engine: LlamaEngine) -> None:
    assert list(tiny_engine.turn_separator()) == tokens(tiny_engine, CHATML_SEPARATOR)


async def test_an_idle_conversation_gets_its_next_turns_marker(tiny_engine: LlamaEngine) -> None:
    """After a pause the slot holds the answer's last token and the marker; a request in
    the pause (another conversation here) starts the pause again."""
    greedy = SamplingParams(temperature=0.0, max_tokens=6)
    r = await generate(tiny_engine, chat("Tell me about the sea."), greedy, cache_key="sea")
    owed = 1 if r.done.finish_reason == "length" else 0  # the last sampled token

    def held(s: Scheduler) -> list[list[int]]:
        return [list(slot.tokens) for slot in s.slots.slots if slot.cache_key == "sea"]

    (before,) = await tiny_engine.debug_call(held)
    await generate(tiny_engine, chat("Something else."), greedy, cache_key="other")
    assert await tiny_engine.debug_call(held) == [before]  # the engine was busy just now
    await asyncio.sleep(PAUSE)
    await wait_idle(tiny_engine)
    (after,) = await tiny_engine.debug_call(held)
    marker = tokens(tiny_engine, CHATML_SEPARATOR)
    assert after[: len(before)] == before
    assert after[len(before) + owed :] == marker
    await assert_kv_consistent(tiny_engine)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def smol(smollm2_gguf: Path) -> AsyncIterator[LlamaEngine]:
    settings = EngineSettings(
        n_parallel=4, n_ctx=4096, n_ctx_per_seq=2048, n_batch=256, n_threads=1
    )
    engine = LlamaEngine(smollm2_gguf, "smollm2", settings)
    await engine.start()
    yield engine
    await engine.stop()


@pytest.mark.model
@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("max_tokens", [12, 200])  # cut at max_tokens; ended by the model
async def test_a_follow_up_after_a_pause_prefills_only_what_was_typed(
    smol: LlamaEngine, max_tokens: int
) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    typed = "And three animals?"
    owed = tokens(smol, f"{typed}<|im_end|>\n<|im_start|>assistant\n")  # the new user turn
    one = replace(greedy, max_tokens=1)

    async def follow_up(pause: float) -> tuple[int, np.ndarray]:
        await smol.clear_cache()  # nothing cached from the other run of the same prompt
        first = chat("Name three colours, briefly.")
        r1 = await generate(smol, first, greedy, cache_key="c")
        assert r1.done.finish_reason == ("length" if max_tokens == 12 else "stop")
        await asyncio.sleep(pause)
        second = (*first, *chat("x", r1.text, typed)[1:])
        r2 = await generate(smol, second, one, "c", capture_logits=1)
        return r2.done.usage.prompt_tokens - r2.done.usage.cached_tokens, r2.logits[0]

    prefilled, warmed = await follow_up(PAUSE)
    assert prefilled == len(owed)
    await assert_kv_consistent(smol)
    # a script's immediate follow-up: nothing was warmed, the marker is prefilled with it
    marker = len(tokens(smol, CHATML_SEPARATOR)) + (max_tokens == 12)
    prefilled, plain = await follow_up(0.0)
    assert prefilled == len(owed) + marker
    # the marker decoded ahead holds what prefilling it with the follow-up computes, up to
    # rounding: its few rows take the untiled attention kernel, a follow-up's 10 or more the
    # tiled one (scripts/patches/), which differ by up to ~1.0 in SmolLM2's logits as a
    # batched and a token-by-token prefill do; the same first token, the same distribution
    assert int(np.argmax(warmed)) == int(np.argmax(plain))
    assert np.max(np.abs(warmed - plain)) < 0.1 * float(np.ptp(plain))
    pw, pp = softmax(warmed), softmax(plain)
    assert float(np.sum(pp * (np.log(pp + 1e-12) - np.log(pw + 1e-12)))) < 0.02
