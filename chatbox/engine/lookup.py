"""Prompt-lookup decoding: draft the next tokens from n-grams of the prompt and the answer.

When an answer copies from its context (quoting a document, editing pasted code), the
tokens after the latest earlier occurrence of its last few tokens are a good guess of what
comes next. The scheduler decodes those guesses in the same batch as every other stream,
one logits row each, and keeps the longest prefix the sampler agrees with (see
`speculative.verify`): a deterministic draft accepted only where the sampled token equals
it, so the output is distributed exactly as without drafting.

Guessing costs batch rows, so each stream adapts: the draft length follows how much was
accepted lately, and a stream whose guesses are mostly wrong stops drafting for a while
(doubling each time it fails again).
"""

from __future__ import annotations

from collections.abc import Iterable

N_MAX = 4  # longest n-gram matched (longer first: more specific)
N_MIN = 3  # shorter matches are too often a coincidence in plain prose
MIN_RATE = 0.3  # acceptance below this (over recent drafts) pauses drafting
PAUSE_MIN, PAUSE_MAX = 16, 512  # tokens without drafting after a poor run


class Drafter:
    """One stream's n-gram index over prompt + answer, and its acceptance bookkeeping."""

    def __init__(self, tokens: Iterable[int], max_draft: int) -> None:
        self.max_draft = max_draft
        self.hist: list[int] = list(tokens)
        # n -> n-gram -> the position right after its latest occurrence (excluding the
        # n-gram that ends the history now, so a lookup never finds itself). Built when a
        # draft is first asked for, not on admission: indexing a long prompt takes a few
        # ms of the decode thread, which would delay the first token and every other
        # stream's step, and a stream in a crowded batch never drafts at all.
        self._index: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(N_MIN, N_MAX + 1)
        }
        self._indexed = 0  # the history positions up to here are in the index
        self.k = min(2, max_draft)  # start short: grows while guesses are all right
        self.rate = 1.0  # moving acceptance rate
        self._pause = 0
        self._pause_len = PAUSE_MIN
        self.drafted = 0
        self.accepted = 0

    def push(self, token: int) -> None:
        """Record a token of the history (one the sampler chose)."""
        self.hist.append(token)

    def _catch_up(self) -> None:
        """Index the n-grams that end before the newest token, oldest first (so the latest
        occurrence of each wins)."""
        hist = self.hist
        for pos in range(max(self._indexed, N_MIN), len(hist)):
            for n, index in self._index.items():
                if pos >= n:
                    index[tuple(hist[pos - n : pos])] = pos
        self._indexed = len(hist)

    def draft(self, room: int) -> list[int]:
        """Up to min(k, room) guessed tokens following the history (empty: none)."""
        if self._pause > 0:
            self._pause -= 1
            return []
        k = min(self.k, room)
        if k <= 0:
            return []
        self._catch_up()
        hist, n_hist = self.hist, len(self.hist)
        for n in range(N_MAX, N_MIN - 1, -1):
            if n_hist < n:
                continue
            pos = self._index[n].get(tuple(hist[n_hist - n :]))
            if pos is not None:
                return hist[pos : pos + k]
        return []

    def record(self, drafted: int, accepted: int) -> None:
        """Adapt to a verified draft: its length next time, and pausing after poor runs."""
        if drafted <= 0:
            return
        self.drafted += drafted
        self.accepted += accepted
        self.rate = 0.7 * self.rate + 0.3 * (accepted / drafted)
        # All accepted: guess further next time; otherwise just past what was accepted.
        self.k = min(self.max_draft, self.k * 2) if accepted == drafted else max(2, accepted + 1)
        if self.rate < MIN_RATE:
            self._pause = self._pause_len
            self._pause_len = min(PAUSE_MAX, self._pause_len * 2)
            self.rate = MIN_RATE + 0.2  # probe again after the pause
        elif accepted:
            self._pause_len = PAUSE_MIN
