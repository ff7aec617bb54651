"""Saving a running answer while it streams, apart from the stream itself.

The answer's text lives in its run (in memory); its draft row is a copy that lets another
front, or the next start, store what was written should this process die. `DraftSaver` writes
that copy every `every_s` in the background, so the stream never waits on the database: a
write that fails (the database away) is tried again with backoff and the answer streams on.
`until_stored` writes the finished answer, trying again while the database cannot be reached,
so an outage shorter than its bound loses nothing the client saw.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from chatbox.chat.running.runs import TurnRun
from chatbox.store.outage import unreachable

log = logging.getLogger("chatbox.chat")
T = TypeVar("T")
BACKOFF_MAX_S = 4.0  # the longest pause between two tries while the database is away
WRITE_TIMEOUT_S = 10.0  # a draft write that hangs (a cut-off network) is given up and retried


class DraftSaver:
    """Writes `run.text` with `save` every `every_s` while it changes, until `stop`."""

    def __init__(
        self, run: TurnRun, save: Callable[[str], Awaitable[None]], every_s: float
    ) -> None:
        self.run = run
        self.save = save
        self.every_s = max(0.05, every_s)
        self.saved = ""  # the text the draft row holds (a new draft holds none)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> DraftSaver:
        self._task = asyncio.create_task(self._loop())
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task})  # a cancel aimed at the caller still reaches it
            self._task = None

    async def _loop(self) -> None:
        delay = self.every_s
        failing_since: float | None = None
        while True:
            await asyncio.sleep(delay)
            text = self.run.text
            if text == self.saved:
                continue
            try:
                async with asyncio.timeout(WRITE_TIMEOUT_S):
                    await self.save(text)
            except Exception as exc:  # the database away: keep the text here, try again
                if failing_since is None:
                    failing_since = time.monotonic()
                    log.warning(
                        "could not save the draft of answer %s (%s); it streams on and is "
                        "saved when the database is back",
                        self.run.turn_id,
                        unreachable(exc) or repr(exc),
                    )
                delay = min(max(delay * 2, self.every_s), BACKOFF_MAX_S)
                continue
            if failing_since is not None:
                log.warning(
                    "saved the draft of answer %s again after %.1f s",
                    self.run.turn_id,
                    time.monotonic() - failing_since,
                )
                failing_since = None
            self.saved, delay = text, self.every_s


async def until_stored(write: Callable[[], Awaitable[T]], wait_s: float, what: str) -> T:
    """`write()`, tried again with backoff while the store cannot be reached, for `wait_s` at
    most; any other error, or an outage longer than that, is raised."""
    deadline = time.monotonic() + wait_s
    delay = 0.25
    warned = False
    while True:
        try:
            return await write()
        except Exception as exc:
            reason = unreachable(exc)
            if reason is None or time.monotonic() + delay > deadline:
                raise
            if not warned:
                warned = True
                log.warning("could not store %s (%s); trying again", what, reason)
        await asyncio.sleep(delay)
        delay = min(delay * 2, BACKOFF_MAX_S)
