"""What a decode step costs by its size, measured: whether guessed rows pay for themselves.

Prompt-lookup guesses ride in the step as extra rows. Whether they pay depends on the
device: on a GPU a few more rows cost almost nothing, on a CPU they can cost a whole step
(llama.cpp's batched matrix kernel takes over from 2 rows, so on 2 cores one guessed token
about doubles a lone stream's step and pays only if it is nearly always right). So the
step's time is learned per size, and a stream guesses only as far as
the tokens it expects to gain outweigh what the rows add (`lookup.Drafter.worth`).
"""

from __future__ import annotations

from collections.abc import Callable

from chatbox.engine.tuning import depth_class

# How many times a step costs with k guessed rows more (None: not measured yet).
StepRatio = Callable[[int], float | None]

ALPHA = 0.2  # weight of the newest step in a moving average (the machine's load drifts)
MAX_TOKENS = 64  # steps larger than this are prefill: no guesses ride in them


def _key(n_tokens: int, n_seqs: int, depth: int) -> tuple[int, int, int]:
    # Rows of one sequence are cheaper than as many sequences (each attends on its own), and
    # a deep step costs more per row: compare like with like.
    return n_tokens, min(n_seqs, 3), depth_class(depth)


class StepCosts:
    """Moving averages of a llama_decode call's seconds, by tokens, sequences and depth.
    Written and read on the decode thread only."""

    def __init__(self) -> None:
        self._seconds: dict[tuple[int, int, int], float] = {}

    def observe(self, n_tokens: int, n_seqs: int, depth: int, seconds: float) -> None:
        """A step of n_tokens rows over n_seqs sequences, at most `depth` cells deep."""
        if n_tokens > MAX_TOKENS or n_seqs <= 0:
            return
        key = _key(n_tokens, n_seqs, depth)
        old = self._seconds.get(key)
        self._seconds[key] = seconds if old is None else old + ALPHA * (seconds - old)

    def ratio(self, n_tokens: int, n_seqs: int, extra: int, depth: int) -> float | None:
        """How many times a step of n_tokens costs with `extra` more rows in one of its
        sequences (None: one of the two not measured yet)."""
        base = self._seconds.get(_key(n_tokens, n_seqs, depth))
        more = self._seconds.get(_key(n_tokens + extra, n_seqs, depth))
        if not base or more is None:
            return None
        return more / base

    def for_step(self, n_streams: int, depth: int) -> StepRatio:
        """What k guessed rows add to a step of n_streams one-token streams at `depth`."""
        return lambda k: self.ratio(n_streams, n_streams, k, depth)
