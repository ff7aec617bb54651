"""Cores that urgent work outside the engines asks the engines to leave free.

llama.cpp's worker threads spin at barriers inside every step, so on a small machine a
person-facing task in the same process (embedding the message being moderated, a search)
that has to share a core with a spinning worker waits for the whole step, and the step
stalls too. While such work runs it holds a core here, and the engines run their next
steps on the cores left (at least one).

The share is the process's, like its cores (torch's thread count is process-wide too), so
it is one object per process rather than one per app.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class CoreShare:
    """A count of cores held by urgent non-engine work, safe to use from any thread."""

    def __init__(self) -> None:
        self._held = 0
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        return self._held

    @contextmanager
    def hold(self, n: int = 1) -> Iterator[None]:
        """Ask the engines to leave n cores free while the block runs."""
        with self._lock:
            self._held += n
        try:
            yield
        finally:
            with self._lock:
                self._held -= n


URGENT = CoreShare()
