"""Prefill pacing: how many prompt tokens may join a step without stalling running streams.

A token bucket of *stall time*: every step with running streams earns
`(stall_ratio - 1) x decode_step_time` of credit; a prefill chunk spends what it actually
added to the step. Chunks go in only when the credit covers their estimated cost, so the
mean time per output token stays within `stall_ratio` x a decode-only step, while chunks are
big enough for batched prefill to stay efficient (`chunk` tokens, fewer where one would make
streams stutter for long). Costs are learned online.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from chatbox.engine.types import GenerationRequest

log = logging.getLogger("chatbox.engine.scheduler")  # one line a step, where it always was

REFRESH_EVERY = 16  # a decode-only step at least this often keeps the baseline current
MAX_STUTTER = 4.0  # a chunk should add at most this many decode steps' time to its step
MIN_CHUNK = 16  # ...but never fewer tokens than this (efficiency)
PROTECT_AFTER = 4  # a stream is shielded from prefill stalls once it has this many tokens


class PacedJob(Protocol):
    """What pacing reads of a request on the decode thread (`job.Job`)."""

    @property
    def request(self) -> GenerationRequest: ...

    @property
    def prompt(self) -> Sequence[int]: ...

    @property
    def n_done(self) -> int: ...  # prompt tokens in KV

    @property
    def n_generated(self) -> int: ...


class PrefillPacer:
    def __init__(self, capacity: int, stall_ratio: float, chunk: int = 64) -> None:
        self.capacity = capacity  # tokens per step (n_batch)
        self.stall_ratio = stall_ratio
        self.chunk = max(1, min(chunk, capacity))
        self.decode_time = 0.0  # EWMA seconds of a decode-only step
        self.token_cost = 0.0  # EWMA seconds one prefill token adds to a step
        self.credit = 0.0
        self._steps = 0

    def allowance(self, n_protected: int, n_waiting: int, room: int) -> int:
        """Prefill tokens the next step may carry.

        n_protected: established streams to shield; n_waiting: prompt tokens not yet in KV;
        room: free rows in the batch.
        """
        if n_waiting <= 0 or room <= 0:
            self.credit = 0.0
            return 0
        if n_protected == 0 or self.stall_ratio <= 0:
            return room
        self._steps += 1
        if not self.decode_time or self._steps % REFRESH_EVERY == 0:
            return 0  # measure (or re-measure) a pure decode step first
        want = min(self._chunk_size(), n_waiting, room)
        cost = want * (self.token_cost or self.decode_time / n_protected)
        self.credit = min(self.credit + (self.stall_ratio - 1.0) * self.decode_time, cost * 1.5)
        return want if self.credit >= cost else 0

    def _chunk_size(self) -> int:
        """The configured chunk, smaller where one would stall streams for > MAX_STUTTER steps."""
        if not self.token_cost or not self.decode_time:
            return self.chunk
        fits = int(MAX_STUTTER * self.decode_time / self.token_cost)
        return max(min(self.chunk, fits), min(MIN_CHUNK, self.chunk))

    def observe(self, n_decode: int, n_prefill: int, elapsed: float) -> None:
        """Learn from a finished step (n_prefill: prompt tokens it carried)."""
        self._learn(n_decode, n_prefill, elapsed)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "step: %d decode, %d prefill tokens, %.1f ms; decode %.1f ms, token %.2f ms,"
                " credit %.1f ms",
                *(n_decode, n_prefill, elapsed * 1000, self.decode_time * 1000),
                *(self.token_cost * 1000, self.credit * 1000),
            )

    def _learn(self, n_decode: int, n_prefill: int, elapsed: float) -> None:
        if n_prefill == 0:
            if n_decode:
                a = 0.2 if self.decode_time else 1.0
                self.decode_time += a * (elapsed - self.decode_time)
            return
        if n_decode == 0:
            per_token = elapsed / n_prefill
        else:
            extra = max(elapsed - self.decode_time, 0.0)
            self.credit -= extra
            per_token = extra / n_prefill
        a = 0.3 if self.token_cost else 1.0
        self.token_cost += a * (per_token - self.token_cost)


def prefill_budget(
    pacer: PrefillPacer, decoding: Sequence[PacedJob], prefilling: Sequence[PacedJob], room: int
) -> int:
    """Prompt tokens the next step carries; `prefilling` sorted most urgent first.

    Pacing shields established streams (a burst arriving together is not shielded yet) from
    prompts of their own priority or lower. A prompt more urgent than every established
    stream (a paid request while only free answers run) goes in whole instead of waiting
    politely behind them; the less urgent prompts stay paced.
    """
    if not prefilling:
        return pacer.allowance(0, 0, room)
    urgent = prefilling[0].request.priority
    established = [j for j in decoding if j.n_generated >= PROTECT_AFTER]
    shielded = sum(1 for j in established if j.request.priority <= urgent)
    if established and not shielded:
        first = [j for j in prefilling if j.request.priority == urgent]
        return min(room, sum(len(j.prompt) - j.n_done for j in first))
    waiting = sum(len(j.prompt) - j.n_done for j in prefilling)
    return pacer.allowance(shielded, waiting, room)
