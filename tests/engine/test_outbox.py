"""A step's events reach the event loop in one wake-up (outbox.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from chatbox.engine.engine import LlamaEngine
from chatbox.engine.outbox import Outbox
from chatbox.engine.types import ChatMessage, GenerationRequest, SamplingParams
from tests.engine.conftest import TINY_SETTINGS
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


async def test_an_interval_holds_tokens_until_it_passes_or_something_urgent_comes() -> None:
    loop = asyncio.get_running_loop()
    box = Outbox(interval_s=10.0)
    got: list[str] = []
    seen: list[list[str]] = []

    def step() -> None:
        box.owner = threading.get_ident()
        box.post(loop, got.append, "first", lambda: None, urgent=True)
        box.flush()  # urgent: handed over at once
        for text in ("a", "b"):  # not urgent, and the interval has not passed: held
            box.post(loop, got.append, text, lambda: None, urgent=False)
            box.flush()
        time.sleep(0.05)  # the loop is free to run whatever it was handed
        seen.append(list(got))
        box.post(loop, got.append, "done", lambda: None, urgent=True)
        box.flush()  # an answer's end takes everything held with it

    await asyncio.to_thread(step)
    await asyncio.sleep(0)
    assert seen == [["first"]]
    assert got == ["first", "a", "b", "done"]


async def test_an_answer_streams_in_fewer_events_at_an_interval_with_the_same_text(
    tiny_gguf: Path, tiny_engine: LlamaEngine
) -> None:
    """At the default interval a fast answer arrives as its first token, then in a few
    pieces: the same text as token by token (stream_interval_s=0)."""
    slow = LlamaEngine(tiny_gguf, "tiny", replace(TINY_SETTINGS, stream_interval_s=0.05))
    await slow.start()
    try:
        greedy = SamplingParams(temperature=0.0, max_tokens=200)
        msgs = chat("Tell me everything.")
        each = await collect(tiny_engine.submit(GenerationRequest(msgs, greedy), ignore_eog=True))
        await collect(slow.submit(GenerationRequest(chat("Hi."), greedy)))  # its end: a flush
        held = await collect(slow.submit(GenerationRequest(msgs, greedy), ignore_eog=True))
    finally:
        await slow.stop()
        slow.close()
    assert held.text == each.text and held.done.usage.completion_tokens == 200
    # the first token at once, alone (not held for the interval with what follows it)
    assert held.text.startswith(held.chunks[0]) and 0 < len(held.chunks[0]) <= 4
    assert held.done.timings is not None
    intervals = held.done.timings.decode_s / 0.05  # then a piece an interval, and the end
    assert len(held.chunks) <= 3 + intervals
    # Pieces of several tokens, whatever the load: how many an unpaced stream joins depends
    # on how often its event loop gets a core, so it is not the measure.
    assert len(held.chunks) < 200 / 2
