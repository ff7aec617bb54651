"""Server-Sent Events framing: ids on every event, heartbeats while waiting, no buffering."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from litestar.params import HeaderParameter
from litestar.response import Stream

from chatbox.chat import RunEvent, TurnRun

SSE_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # nginx and friends must not hold events back
    "Connection": "keep-alive",
}


def frame(event: str | None, data: str, event_id: int | str | None = None) -> bytes:
    lines = []
    if event_id is not None:
        lines.append(f"id: {event_id}")
    if event is not None:
        lines.append(f"event: {event}")
    lines.extend(f"data: {line}" for line in data.split("\n"))
    return ("\n".join(lines) + "\n\n").encode()


READ_AHEAD = 64  # chunks a stream's reader may get ahead of a slow client


async def with_heartbeats(source: AsyncIterator[bytes], every_s: float) -> AsyncIterator[bytes]:
    """Pass chunks through, sending an SSE comment whenever the source is quiet for every_s.

    One task reads the source for the whole response and hands chunks over; chunks that
    arrive while the client is being written to go out together in the next write. That
    costs one future per chunk instead of a task and a timeout per chunk (this runs once
    per token of every streamed answer, on the event loop the decode threads share the
    cores with), and the source is never cancelled mid-chunk by a heartbeat.
    """
    loop = asyncio.get_running_loop()
    ready: list[bytes] = []
    state = _Handover()

    async def read() -> None:
        try:
            async for chunk in source:
                ready.append(chunk)
                state.wake()
                if len(ready) >= READ_AHEAD:  # the client is slow: wait for the writer
                    state.room = loop.create_future()
                    await state.room
        except BaseException as exc:  # handed to the writer, which raises it
            state.error = exc
        finally:
            state.ended = True
            state.wake()

    reader = loop.create_task(read())
    try:
        while True:
            if ready:
                chunk = ready[0] if len(ready) == 1 else b"".join(ready)
                ready.clear()
                state.make_room()
                yield chunk
                continue
            if state.ended:
                if state.error is not None:
                    raise state.error
                return
            state.waiter = loop.create_future()
            timer = loop.call_later(every_s, state.wake)
            try:
                await state.waiter
            finally:
                timer.cancel()
            if not ready and not state.ended:
                yield b": keep-alive\n\n"
    finally:
        if not reader.done():
            reader.cancel()
        with contextlib.suppress(BaseException):
            await reader
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            await aclose()


class _Handover:
    """What the reader and the writer of with_heartbeats share."""

    __slots__ = ("ended", "error", "room", "waiter")

    def __init__(self) -> None:
        self.waiter: asyncio.Future[None] | None = None  # the writer waits for a chunk
        self.room: asyncio.Future[None] | None = None  # the reader waits for the writer
        self.ended = False
        self.error: BaseException | None = None

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def make_room(self) -> None:
        if self.room is not None and not self.room.done():
            self.room.set_result(None)


Renderer = Callable[[RunEvent], bytes | None]


def json_event(event: RunEvent) -> bytes:
    return frame(event.kind, json.dumps(event.data, ensure_ascii=False), event.id)


async def run_events(run: TurnRun, after: int, render: Renderer) -> AsyncIterator[bytes]:
    async with contextlib.aclosing(run.follow(after)) as events:
        async for event in events:
            chunk = render(event)
            if chunk is not None:
                yield chunk


def sse_response(
    run: TurnRun,
    after: int,
    heartbeat_s: float,
    render: Renderer = json_event,
    headers: dict[str, Any] | None = None,
) -> Stream:
    """Stream a run's events (those after `after`) as SSE."""
    body = with_heartbeats(run_events(run, after, render), heartbeat_s)
    return Stream(body, media_type="text/event-stream", headers={**SSE_HEADERS, **(headers or {})})


LastEventId = Annotated[str | None, HeaderParameter(name="Last-Event-ID", required=False)]


def last_event_id(raw: str | None) -> int:
    """The Last-Event-ID a reconnecting client sent, or 0."""
    try:
        return max(0, int(raw or 0))
    except ValueError:
        return 0
