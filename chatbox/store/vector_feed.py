"""Change notices for the vec0 tables, published after each commit.

Every repository that writes `memory_vec`, `chunk_vec` or `turn_vec` publishes a
`VectorChange` on the database's `VectorFeed` right after its transaction commits, so an
in-RAM copy (the knowledge layer's index) can stay in step. On PostgreSQL the other fronts
hear of it through `NOTIFY` as a `reload` of that partition (chatbox/store/pg.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class VectorChange:
    """Committed writes to one (table, user) partition: rows added or replaced, rows gone;
    `reload`: another front changed it (PostgreSQL), so a copy of it must be read again."""

    table: str
    user_id: str
    rowids: Sequence[int] = ()  # added or replaced, one per row of `vectors`
    vectors: np.ndarray | None = None
    deleted: Sequence[int] = field(default_factory=tuple)
    reload: bool = False


Listener = Callable[[VectorChange], Awaitable[None]]


class VectorFeed:
    """Listeners told of every committed vector write. A listener's code before its first
    `await` runs before the writer's task yields (the index relies on that)."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def unsubscribe(self, listener: Listener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    async def publish(self, change: VectorChange) -> None:
        if change.rowids or change.deleted or change.reload:
            for listener in list(self._listeners):
                await listener(change)
