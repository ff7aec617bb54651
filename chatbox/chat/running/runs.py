"""A running answer: its events are kept so a client that reconnects gets the rest."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunEvent:
    id: int
    kind: str  # token | done | error
    data: dict[str, Any]

    @property
    def terminal(self) -> bool:
        return self.kind in ("done", "error")


@dataclass
class TurnRun:
    """One assistant answer being generated; `follow()` replays then streams its events."""

    conversation_id: str
    turn_id: str
    parent_id: str
    model: str
    user_turn_id: str | None
    grace_s: float
    on_abandon: Callable[[], None] = lambda: None
    events: list[RunEvent] = field(default_factory=list)
    text: str = ""
    prompt_tokens: int = 0  # the fitted prompt's (a cached answer's: none)
    tokens: int = 0  # the answer's tokens so far, as the engine sent them
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _followers: int = 0
    _abandon_timer: asyncio.TimerHandle | None = None

    @property
    def finished(self) -> bool:
        return bool(self.events) and self.events[-1].terminal

    def publish(self, kind: str, data: dict[str, Any]) -> RunEvent:
        event = RunEvent(len(self.events) + 1, kind, data)
        if kind == "token":
            self.text += data["text"]
        self.events.append(event)
        # Wake every follower, then arm a fresh event for the next publish.
        self._changed.set()
        self._changed = asyncio.Event()
        return event

    async def follow(self, after: int = 0) -> AsyncGenerator[RunEvent, None]:
        """Events with id > after, waiting for new ones until the terminal event."""
        self._attach()
        try:
            position = max(0, after)
            while True:
                while position < len(self.events):
                    event = self.events[position]
                    position += 1
                    yield event
                    if event.terminal:
                        return
                if self.finished:  # a late reader already has everything
                    return
                await self._changed.wait()
        finally:
            self._detach()

    async def batches(self, after: int = 0) -> AsyncGenerator[list[RunEvent], None]:
        """`follow`, but every event already waiting comes at once (a relay sends fewer,
        larger messages)."""
        self._attach()
        try:
            position = max(0, after)
            while True:
                if position < len(self.events):
                    batch = self.events[position:]
                    position = len(self.events)
                    yield batch
                    if batch[-1].terminal:
                        return
                    continue
                if self.finished:
                    return
                await self._changed.wait()
        finally:
            self._detach()

    def _attach(self) -> None:
        self._followers += 1
        if self._abandon_timer is not None:
            self._abandon_timer.cancel()
            self._abandon_timer = None

    def _detach(self) -> None:
        self._followers -= 1
        if self._followers == 0 and not self.finished:
            # The last reader went away: give it a moment to reconnect, then stop generating.
            loop = asyncio.get_running_loop()
            self._abandon_timer = loop.call_later(self.grace_s, self._abandon)

    def _abandon(self) -> None:
        self._abandon_timer = None
        if self._followers == 0 and not self.finished:
            self.on_abandon()


def drive(run: TurnRun, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    """Start the task that writes `run`'s answer; should it end without the run's terminal
    event (storing the answer failed, the process is closing), the run ends with an error
    event, so no reader waits on heartbeats for an answer that will never come."""
    task = asyncio.create_task(work)

    def ended(task: asyncio.Task[None]) -> None:
        if run.finished:
            return
        if task.cancelled():
            message = "the answer was stopped before it was stored"
        else:
            failure = task.exception()
            log.error("answer %s failed: %r", run.turn_id, failure, exc_info=failure)
            message = "the answer could not be stored"
        data = {"turn_id": run.turn_id, "status": "failed", "finish_reason": "error"}
        run.publish("error", {**data, "model": run.model, "message": message})

    task.add_done_callback(ended)
    return task
