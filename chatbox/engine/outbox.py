"""Events from the decode thread to the event loops, handed over once a step at most.

Waking an event loop (`call_soon_threadsafe` writes to the loop's self-pipe) costs CPU on
the cores llama.cpp's threads spin on, so a wake-up per token of every stream would slow
every step. The scheduler collects a step's events here and hands each loop all of them in
one callback, and with an interval (`stream_interval_s`) only every so often, an answer's
first token and its end at once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

Delivery = tuple[Callable[[Any], None], Any, Callable[[], None]]


def _deliver(items: list[Delivery]) -> None:
    for deliver, item, _ in items:
        deliver(item)


class Outbox:
    """Collects (deliver, item) pairs per event loop until `flush()` hands them over.

    With an interval, a flush hands over only if `interval_s` passed since the last one or
    an urgent item (an answer's first token, its end) waits: each wake-up of an event loop
    costs it ~0.2 ms of the cores llama.cpp's threads spin on, whatever it carries.
    """

    def __init__(self, interval_s: float = 0.0) -> None:
        self._pending: dict[asyncio.AbstractEventLoop, list[Delivery]] = {}
        self.owner: int | None = None  # the decode thread's id; others deliver at once
        self.interval_s = interval_s
        self._urgent = False
        self._last = 0.0  # when the last flush handed something over

    def post(
        self,
        loop: asyncio.AbstractEventLoop,
        deliver: Callable[[Any], None],
        item: Any,
        gone: Callable[[], None],
        urgent: bool = True,
    ) -> None:
        """Queue `deliver(item)` to run on `loop`; `gone()` runs instead if it has closed.
        An item that is not `urgent` may wait for the interval."""
        entry = (deliver, item, gone)
        if threading.get_ident() != self.owner:  # not between steps: nothing will flush it
            self._send(loop, [entry])
            return
        self._pending.setdefault(loop, []).append(entry)
        self._urgent = self._urgent or urgent

    def flush(self, force: bool = False) -> None:
        """Hand every loop its queued events (one wake-up per loop), unless they may wait."""
        if not self._pending:
            return
        now = time.perf_counter()
        if not (force or self._urgent or now - self._last >= self.interval_s):
            return
        self._urgent, self._last = False, now
        pending, self._pending = self._pending, {}
        for loop, items in pending.items():
            self._send(loop, items)

    @staticmethod
    def _send(loop: asyncio.AbstractEventLoop, items: list[Delivery]) -> None:
        try:
            loop.call_soon_threadsafe(_deliver, items)
        except RuntimeError:  # the loop is gone: nobody is listening any more
            for _, _, gone in items:
                gone()
