"""n answers to one prompt: prefill it once, then fork its KV for the other answers.

The first job carries the others in `Job.forks`. When its prompt is prefilled and its
first logits row is ready, `start_forks` gives each fork a copy of the prompt's KV and
samples its first token from that same row. The scheduler passes itself in as `host`
(see `ForkHost`), so this module never imports it.
"""

from __future__ import annotations

import heapq
from typing import Protocol

from chatbox.engine.job import Job, start_sampling
from chatbox.engine.kv.slots import SlotTable
from chatbox.engine.llama import Model
from chatbox.engine.types import FinishReason


class ForkHost(Protocol):
    """What forking needs of the decode thread (the scheduler)."""

    model: Model
    slots: SlotTable
    n_parallel: int
    active: list[Job]
    waiting: list[Job]

    def finish(self, job: Job, reason: FinishReason, error: str | None = None) -> None: ...
    def fail(self, job: Job, exc: Exception) -> None: ...
    def verify(self, job: Job, idx: int) -> None: ...


def start_forks(job: Job, idx: int, host: ForkHost) -> None:
    """The prompt is prefilled: start the other answers from a copy of its KV, sampling
    their first tokens from the same logits row (n answers, one prefill)."""
    assert job.slot is not None
    forks, job.forks = job.forks, []
    for fork in forks:
        if fork.cancelled:
            host.finish(fork, "cancelled")
            continue
        slot = host.slots.fork(job.slot) if len(host.active) < host.n_parallel else None
        if slot is None:  # no free sequence: it queues and prefills on its own
            heapq.heappush(host.waiting, fork)
            continue
        fork.slot, fork.n_done, fork.cached = slot, len(fork.prompt), len(fork.prompt)
        host.active.append(fork)
        try:
            start_sampling(fork, host.model, see_prompt=False)
            host.verify(fork, idx)  # samples its first token; may finish it
        except Exception as exc:
            host.fail(fork, exc)
