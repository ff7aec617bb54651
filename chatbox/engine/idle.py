"""What the decode thread does while nothing decodes: the next turns' markers, then
parking idle conversations ahead of need.

With a KV stream per slot a finished conversation stays live in its slot until another
conversation takes the slot; it is parked (its state saved to host RAM and disk) then, on
the decode thread, while every running stream waits. A 1,900-token conversation's state is
44 MB: 4-5 ms to save into memory the state pool kept, 90-160 ms into fresh memory on a
virtual machine that backs guest memory on first touch (kv/state.py). So once the engine has sat
idle for `PARK_AHEAD_S` after its last answer (after the turns' markers, which change what
would be saved), idle conversations are saved one at a time, least recently used first,
and stay live: taking such a slot later only drops its KV.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from chatbox.engine.turns import TurnTails

if TYPE_CHECKING:
    from chatbox.engine.job import Job
    from chatbox.engine.kv.slots import SlotTable
    from chatbox.engine.llama import Batch, Context
    from chatbox.engine.types import FinishReason

PARK_AHEAD_S = 1.0  # idle time after the last answer before conversations are parked ahead


class IdleWork:
    """The turns' markers (turns.py) and parking ahead (SlotTable.park_ahead), in that order."""

    def __init__(
        self, n_ctx_per_seq: int, slots: SlotTable, park_ahead_s: float = PARK_AHEAD_S
    ) -> None:
        self.turns = TurnTails(n_ctx_per_seq)
        self.slots = slots
        self.park_ahead_s = park_ahead_s
        self._ended_at = 0.0
        self._ahead = False  # an answer ended since parking ahead last ran out of work

    def ended(self, job: Job, reason: FinishReason) -> None:
        """A job released its slot: its conversation may come back, or be parked ahead."""
        self.turns.note(job, reason)
        self._ended_at = time.monotonic()
        self._ahead = True

    def wait_s(self) -> float | None:
        """Seconds until idle work is due (None: there is none)."""
        due = self.turns.wait_s()
        if self._ahead:
            ahead = max(0.0, self._ended_at + self.park_ahead_s - time.monotonic())
            due = ahead if due is None else min(due, ahead)
        return due

    def run(self, ctx: Context, batch: Batch) -> None:
        """One piece of the work that is due: the scheduler reads its inbox between two."""
        if self.turns.wait_s() == 0.0:  # a tail is due (None: none is pending)
            self.turns.warm(ctx, batch, self.slots)
        elif self._ahead and time.monotonic() >= self._ended_at + self.park_ahead_s:
            self._ahead = self.slots.park_ahead()
