"""SSE framing: multi-line data, ids, heartbeats while the source is quiet, hand-over."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from chatbox.web.sse import READ_AHEAD, frame, last_event_id, with_heartbeats


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


async def test_chunks_that_arrive_during_a_write_go_out_together_in_order() -> None:
    written = asyncio.Event()

    async def burst() -> AsyncIterator[bytes]:
        yield b"data: 1\n\n"
        await written.wait()
        for i in range(2, 5):
            yield f"data: {i}\n\n".encode()

    stream = with_heartbeats(burst(), 5.0)
    first = await stream.__anext__()
    written.set()
    await asyncio.sleep(0.01)  # a slow write: the rest of the burst arrives meanwhile
    rest = [chunk async for chunk in stream]
    assert first == b"data: 1\n\n"
    assert rest == [b"data: 2\n\ndata: 3\n\ndata: 4\n\n"]


async def test_a_failing_source_fails_the_stream() -> None:
    async def broken() -> AsyncIterator[bytes]:
        yield b"data: ok\n\n"
        raise RuntimeError("the store went away")

    stream = with_heartbeats(broken(), 5.0)
    assert await stream.__anext__() == b"data: ok\n\n"
    with pytest.raises(RuntimeError, match="went away"):
        await stream.__anext__()


async def test_a_slow_client_holds_the_source_back() -> None:
    made = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal made
        while True:
            made += 1
            yield b"data: x\n\n"
            await asyncio.sleep(0)

    stream = with_heartbeats(endless(), 5.0)
    await stream.__anext__()
    await asyncio.sleep(0.2)  # the client reads nothing for a while
    assert made <= READ_AHEAD + 2
    chunk = await stream.__anext__()
    assert chunk.count(b"data: x") >= READ_AHEAD - 1  # what was read ahead, in one write
    await stream.aclose()
