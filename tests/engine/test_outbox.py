"""A step's events reach the event loop in one wake-up (outbox.py)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from chatbox.engine.engine import LlamaEngine
from chatbox.engine.outbox import Outbox
from chatbox.engine.types import ChatMessage, GenerationRequest, SamplingParams
from tests.engine.helpers import chat, collect, hold_scheduler


async def test_concurrent_streams_wake_the_loop_once_a_step(
    tiny_engine: LlamaEngine, monkeypatch: Any
) -> None:
    """Four answers decoding together: every token arrives, in order, complete; the loop is
    woken once a step (about as often as one answer has tokens), not once a token."""
    loop = asyncio.get_running_loop()
    wakes = 0
    real = loop.call_soon_threadsafe

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal wakes
        if threading.current_thread().name == "chatbox-decode":
            wakes += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counted)
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    prompts = [chat(f"Story number {i}.") for i in range(4)]

    def run(msgs: tuple[ChatMessage, ...]) -> Any:  # every answer runs to max_tokens
        return collect(tiny_engine.submit(GenerationRequest(msgs, greedy), ignore_eog=True))

    held = await hold_scheduler(tiny_engine, 0.2)  # all four start in the same step
    results = await asyncio.gather(*(run(p) for p in prompts))
    await held
    assert all(r.done.usage.completion_tokens == 24 for r in results)
    # 4 x 24 tokens and 4 "done"s came in about 24 steps, each step's in one wake-up
    assert wakes <= 24 + 4

    alone = await run(prompts[0])  # the same text when alone
    assert alone.text == results[0].text


async def test_events_wait_for_the_flush_on_the_owning_thread() -> None:
    loop = asyncio.get_running_loop()
    box = Outbox()
    got: list[int] = []
    gone: list[int] = []

    def step() -> None:  # the "decode thread": posts two events, then flushes
        box.owner = threading.get_ident()
        box.post(loop, got.append, 1, lambda: gone.append(1))
        box.post(loop, got.append, 2, lambda: gone.append(2))
        assert got == []  # nothing is handed over before the step ends
        box.flush()

    await asyncio.to_thread(step)
    await asyncio.sleep(0)
    assert got == [1, 2] and gone == []

    box.post(loop, got.append, 3, lambda: gone.append(3))  # not the owner: delivered at once
    await asyncio.sleep(0)
    assert got == [1, 2, 3]


def test_a_closed_loop_cancels_instead() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    box = Outbox()
    box.owner = threading.get_ident()
    gone: list[str] = []
    box.post(loop, print, "never", lambda: gone.append("cancelled"))
    box.flush()
    assert gone == ["cancelled"]
