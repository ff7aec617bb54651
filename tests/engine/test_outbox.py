"""A step's events reach the event loop in one wake-up (outbox.py)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from chatbox.engine.engine import LlamaEngine
from chatbox.engine.outbox import Outbox
from chatbox.engine.types import SamplingParams
from tests.engine.helpers import chat, generate


async def test_concurrent_streams_wake_the_loop_once_a_step(
    tiny_engine: LlamaEngine, monkeypatch: Any
) -> None:
    """Four answers decoding together: every token arrives, in order, complete; the loop is
    woken far fewer times than there are events (once a step, not once a token)."""
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
    results = await asyncio.gather(*(generate(tiny_engine, p, greedy) for p in prompts))
    events = sum(len(r.chunks) + 1 for r in results)  # text events and "done"
    assert all(r.done.finish_reason in ("stop", "length") for r in results)
    assert all(len(r.chunks) > 4 for r in results)
    assert wakes <= events // 2

    alone = await generate(tiny_engine, prompts[0], greedy)  # the same text when alone
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
