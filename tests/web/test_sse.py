"""SSE framing: multi-line data, ids, and heartbeats while the source is quiet."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from chatbox.web.sse import frame, last_event_id, with_heartbeats


def test_frame_has_id_event_and_every_data_line() -> None:
    assert frame("token", "a\nb", 7) == b"id: 7\nevent: token\ndata: a\ndata: b\n\n"


def test_last_event_id_tolerates_garbage() -> None:
    assert last_event_id("12") == 12
    assert last_event_id(None) == 0
    assert last_event_id("x") == 0
    assert last_event_id("-3") == 0


async def test_heartbeats_fill_silence_and_the_source_is_closed() -> None:
    closed = asyncio.Event()

    async def slow() -> AsyncIterator[bytes]:
        try:
            await asyncio.sleep(0.35)
            yield b"data: late\n\n"
            await asyncio.sleep(10)
            yield b"never"
        finally:
            closed.set()

    out = []
    stream = with_heartbeats(slow(), 0.1)
    async for chunk in stream:
        out.append(chunk)
        if chunk.startswith(b"data"):
            break
    await stream.aclose()  # what the server does when the client goes away
    assert out[-1] == b"data: late\n\n"
    assert out.count(b": keep-alive\n\n") >= 2
    await asyncio.wait_for(closed.wait(), 1)
