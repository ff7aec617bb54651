"""EngineGeneration: the event loop's side of a running request (its events, cancel)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import numpy as np

from chatbox.engine.job import Job
from chatbox.engine.types import DoneEvent, EngineEvent, TokenEvent, Usage


class EngineGeneration:
    """A running request: `async for event in gen`; `gen.cancel()` stops it next step.

    Abandoning the iteration (break, aclose, garbage collection) cancels too.
    """

    def __init__(
        self,
        wake: Callable[[], None],
        job: Job,
        events: asyncio.Queue[EngineEvent],
        jobs: list[Job] | None = None,
    ) -> None:
        self._wake = wake  # the decode thread looks at cancellations when woken
        self._job = job
        self._jobs = jobs or [job]  # n answers: the first job and its forks
        self._events = events
        self._finished = False
        self._held: EngineEvent | None = None  # read ahead of the event being handed out
        self._ended: dict[int, DoneEvent] = {}  # by answer index (n answers end one by one)
        self.prompt_tokens = len(job.prompt)

    @property
    def first_logits(self) -> list[np.ndarray]:
        """Logits of the first sampled positions (only with submit(..., capture_logits=N))."""
        return self._job.logits

    def __aiter__(self) -> AsyncIterator[EngineEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[EngineEvent]:
        # What was read ahead and the answers ended so far live on the generation, not on
        # one iterator: a reader that stops early leaves them to the next (a cancel's settle).
        ended = self._ended
        try:
            while not self._finished:
                if self._held is None:
                    event = await self._events.get()
                else:
                    event, self._held = self._held, None
                if isinstance(event, TokenEvent):
                    event, self._held = _coalesce(event, self._events)
                if isinstance(event, DoneEvent):
                    ended[event.index] = event
                    if len(ended) < len(self._jobs):
                        continue
                    self._finished = True
                    event = _combined(ended) if len(ended) > 1 else event
                yield event
        finally:
            if not self._finished:
                self.cancel()

    def cancel(self) -> None:
        live = [j for j in self._jobs if not j.done and not j.cancelled]
        for job in live:
            job.cancelled = True
        if live:
            self._wake()

    def __del__(self) -> None:
        try:
            if not self._finished:
                self.cancel()
        except Exception:
            pass


def _coalesce(
    event: TokenEvent, events: asyncio.Queue[EngineEvent]
) -> tuple[TokenEvent, EngineEvent | None]:
    """Join the tokens of one answer that queued up behind `event` (and the next event of
    another kind, held back). A consumer that fell behind (a busy event loop under many
    streams) then pays for one chunk per wake-up instead of one per token, and catches up
    instead of taking CPU from the decode threads; the text and logprobs are unchanged, and
    the joined events are kept in `parts` (the OpenAI API writes one chunk per token)."""
    joined: list[TokenEvent] = []
    while not events.empty():
        nxt = events.get_nowait()
        if not isinstance(nxt, TokenEvent) or nxt.index != event.index:
            return _joined(event, joined), nxt
        joined.append(nxt)
    return _joined(event, joined), None


def _joined(first: TokenEvent, rest: list[TokenEvent]) -> TokenEvent:
    if not rest:
        return first
    parts = (first, *rest)
    text = "".join(p.text for p in parts)
    logprobs = tuple(lp for p in parts for lp in p.logprobs)
    return TokenEvent(text, first.index, logprobs, parts)


def _combined(ended: dict[int, DoneEvent]) -> DoneEvent:
    """One DoneEvent for n answers: the prompt counted once, every answer's tokens."""
    done = [ended[i] for i in sorted(ended)]
    errors = [d for d in done if d.finish_reason == "error"]
    first = errors[0] if errors else done[0]
    usage = Usage(
        first.usage.prompt_tokens,
        sum(d.usage.completion_tokens for d in done),
        done[0].usage.cached_tokens,
    )
    reasons = tuple(d.finish_reason for d in done)
    return DoneEvent(first.finish_reason, usage, first.error, reasons)
