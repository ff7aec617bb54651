"""While the engine sits idle, conversations are parked ahead of need and stay live (idle.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from chatbox.engine.engine import LlamaEngine
from chatbox.engine.idle import PARK_AHEAD_S
from chatbox.engine.kv.parking import Parked
from chatbox.engine.scheduler import Scheduler
from chatbox.engine.types import SamplingParams
from tests.engine.conftest import TINY_SETTINGS
from tests.engine.helpers import assert_kv_consistent, chat, generate, running, wait_idle

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


def where(s: Scheduler, key: str) -> tuple[bool, Parked | None]:
    """Whether key is live in a slot, and the parked copy of it RAM holds (if any)."""
    return any(slot.cache_key == key for slot in s.slots.slots), s.slots.parked.get(key)


@pytest.fixture
async def engine(tiny_gguf: Path) -> AsyncIterator[LlamaEngine]:
    """One slot: every other conversation takes it."""
    async with running(tiny_gguf, replace(TINY_SETTINGS, n_parallel=1)) as engine:
        yield engine


async def test_an_idle_conversation_is_parked_ahead_and_its_slot_taken_without_a_save(
    engine: LlamaEngine,
) -> None:
    first = await generate(engine, chat("Tell me about the sea."), GREEDY, cache_key="sea")
    assert await engine.debug_call(lambda s: where(s, "sea")) == (True, None)
    await asyncio.sleep(PARK_AHEAD_S + 0.8)
    await wait_idle(engine)
    live, ahead = await engine.debug_call(lambda s: where(s, "sea"))
    assert live and ahead is not None  # saved while idle, and still live in its slot

    await generate(engine, chat("Something else entirely."), GREEDY, cache_key="other")
    # the slot was taken: the copy parked is the one saved ahead, nothing was saved anew
    live, parked = await engine.debug_call(lambda s: where(s, "sea"))
    assert not live and parked is ahead
    follow = chat("Tell me about the sea.", first.text, "And the waves?")
    r = await generate(engine, follow, GREEDY, cache_key="sea")
    assert r.done.usage.cached_tokens >= first.done.usage.prompt_tokens  # restored
    await assert_kv_consistent(engine)


async def test_a_conversation_that_goes_on_is_not_restored_from_its_stale_copy(
    engine: LlamaEngine,
) -> None:
    first = await generate(engine, chat("Tell me about the sea."), GREEDY, cache_key="sea")
    await asyncio.sleep(PARK_AHEAD_S + 0.8)
    await wait_idle(engine)
    follow = chat("Tell me about the sea.", first.text, "And the waves?")
    second = await generate(engine, follow, GREEDY, cache_key="sea")  # in its live slot
    assert await engine.debug_call(lambda s: where(s, "sea")) == (True, None)
    await generate(engine, chat("Something else entirely."), GREEDY, cache_key="other")
    third = chat("Tell me about the sea.", first.text, "And the waves?", second.text, "Why?")
    r = await generate(engine, third, GREEDY, cache_key="sea")
    # parked as it was after the second turn, when its slot was taken
    assert r.done.usage.cached_tokens >= second.done.usage.prompt_tokens
    await assert_kv_consistent(engine)
