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


async def with_heartbeats(source: AsyncIterator[bytes], every_s: float) -> AsyncIterator[bytes]:
    """Pass chunks through, sending an SSE comment whenever the source is quiet for every_s."""
    pending: asyncio.Task[bytes] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(source.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=every_s)
            if not done:
                yield b": keep-alive\n\n"
                continue
            try:
                chunk = pending.result()
            except StopAsyncIteration:
                return
            finally:
                pending = None
            yield chunk
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            await aclose()


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
