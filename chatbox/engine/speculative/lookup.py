"""Prompt-lookup decoding: draft the next tokens from n-grams of the prompt and the answer.

When an answer copies from its context (quoting a document, editing pasted code), the
tokens after the latest earlier occurrence of its last few tokens are a good guess of what
comes next. The scheduler decodes those guesses in the same batch as every other stream,
one logits row each, and keeps the longest prefix the sampler agrees with (see
`speculative.verify`): a deterministic draft accepted only where the sampled token equals
it, so the output is distributed exactly as without drafting.

Guessing costs batch rows, so each stream adapts: the draft length follows how much was
accepted lately, a guess goes only as far as the tokens it is expected to gain outweigh the
time its rows add to the step (measured: `stepcost.StepCosts`), and a stream whose guesses
do not pay stops drafting for a while (doubling each time), then guesses once regardless,
so both its acceptance and the step's cost are measured afresh.
"""

from __future__ import annotations

from collections.abc import Iterable

from chatbox.engine.speculative.stepcost import StepRatio

N_MAX = 4  # longest n-gram matched (longer first: more specific)
N_MIN = 3  # shorter matches are too often a coincidence in plain prose
MIN_RATE = 0.3  # acceptance below this (over recent drafts) pauses drafting
PAUSE_MIN, PAUSE_MAX = 16, 512  # tokens without drafting after a poor run


class Prior:
    """How often guesses have been right lately, over every stream: where a new stream's
    estimate starts, so that a run of plain-prose answers does not pay for a doomed first
    guess each (a new stream's own record takes over within a few drafts)."""

    def __init__(self) -> None:
        self.right, self.cut = 1.0, 0.25  # optimistic until anything is measured

    def record(self, drafted: int, accepted: int) -> None:
        """Fold in one verified draft (slower than a stream's own sums: many streams)."""
        self.right = 0.9 * self.right + 0.1 * accepted
        self.cut = 0.9 * self.cut + 0.1 * (accepted < drafted)


class Drafter:
    """One stream's n-gram index over prompt + answer, and its acceptance bookkeeping."""

    def __init__(self, tokens: Iterable[int], max_draft: int, prior: Prior | None = None) -> None:
        self.max_draft = max_draft
        self.prior = prior
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
        # Each guess is taken as right with probability q once those before it were: q from
        # moving sums of right guesses and of drafts cut short (optimistic at first).
        self._right, self._cut = (prior.right, prior.cut) if prior else (1.0, 0.25)
        self._probe = False  # the next draft is made whatever it costs (after a pause)
        self._ratio: float | None = None  # what the last draft's rows cost, in plain steps
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

    def draft(self, room: int, cost: StepRatio | None = None) -> list[int]:
        """Up to min(k, room) guessed tokens following the history (empty: none); with
        `cost`, only as many as pay for the rows they add."""
        if self._pause > 0:
            self._pause -= 1
            return []
        k = min(self.k, room)
        if k <= 0:
            return []
        guess = self._match(k)
        if guess and cost is not None and not self._probe:
            k = self.worth(len(guess), cost)
            if k == 0:
                self._rest()
                return []
            guess = guess[:k]
        if guess:
            self._probe = False
            self._ratio = cost(len(guess)) if cost is not None else None
        return guess

    def _match(self, k: int) -> list[int]:
        """The k tokens after the latest earlier occurrence of the history's longest tail."""
        self._catch_up()
        hist, n_hist = self.hist, len(self.hist)
        for n in range(N_MAX, N_MIN - 1, -1):
            if n_hist < n:
                continue
            pos = self._index[n].get(tuple(hist[n_hist - n :]))
            if pos is not None:
                return hist[pos : pos + k]
        return []

    @property
    def q(self) -> float:
        """The chance that a guess is right, given the guesses before it were."""
        return self._right / (self._right + self._cut)

    def worth(self, k_max: int, cost: StepRatio) -> int:
        """The guess length (up to k_max) with the most expected tokens per step time: a
        step with k guesses yields 1 + q + ... + q^k tokens and costs cost(k) plain steps.
        0 where none beats a plain step; k_max where a cost is not measured yet (guess, and
        so measure it)."""
        best, best_k, gain, qi, q = 1.0, 0, 1.0, 1.0, self.q
        for k in range(1, k_max + 1):
            ratio = cost(k)
            if ratio is None:
                return k_max
            qi *= q
            gain += qi
            if gain / ratio > best:
                best, best_k = gain / ratio, k
        return best_k

    def _rest(self) -> None:
        """Stop guessing for a while (longer each time), then guess once whatever it costs."""
        self._pause = self._pause_len
        self._pause_len = min(PAUSE_MAX, self._pause_len * 2)
        self._probe = True

    def record(self, drafted: int, accepted: int) -> None:
        """Adapt to a verified draft: its length next time, and pausing after poor runs."""
        if drafted <= 0:
            return
        self.drafted += drafted
        self.accepted += accepted
        if self.prior is not None:
            self.prior.record(drafted, accepted)
        self.rate = 0.7 * self.rate + 0.3 * (accepted / drafted)
        self._right = 0.7 * self._right + 0.3 * accepted
        self._cut = 0.7 * self._cut + 0.3 * (accepted < drafted)
        # All accepted: guess further next time; otherwise just past what was accepted.
        self.k = min(self.max_draft, self.k * 2) if accepted == drafted else max(2, accepted + 1)
        if self.rate < MIN_RATE:
            self._rest()
            self.rate = MIN_RATE + 0.2  # probe again after the pause
        elif accepted and (self._ratio is None or 1 + accepted >= self._ratio):
            self._pause_len = PAUSE_MIN  # it paid: a later poor run pauses only briefly
