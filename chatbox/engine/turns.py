"""The next turn's template tokens, computed while the person reads the answer.

Every follow-up turn starts with the tokens the chat template puts between an answer and the
next user message (ChatML: `<|im_end|>`, a newline, `<|im_start|>user`, a newline); an
answer cut at max_tokens also still owes the KV its last sampled token. On a long
conversation each prompt token of a follow-up costs about a one-token step of attention
(~9.5 ms a token 1,900 tokens deep on 2 cores), so once the engine has sat idle for
`GRACE_S` since its last answer ended, those tokens are decoded into the conversation's slot
and its next turn prefills only what the person typed. Nothing is warmed while a request
waits or runs, and one conversation at a time, so a request that arrives meanwhile waits for
one short step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from chatbox.engine.job import Job
from chatbox.engine.kv.prefixes import common_prefix
from chatbox.engine.kv.slots import Slot, SlotTable
from chatbox.engine.llama import DECODE_OK, Batch, Context
from chatbox.engine.types import ChatMessage, FinishReason

GRACE_S = 0.5  # idle time after an answer before its turn's tokens are decoded


def turn_separator(
    prompt_tokens: Callable[[tuple[ChatMessage, ...]], list[int]],
    tokenize: Callable[[str], list[int]],
) -> tuple[int, ...]:
    """The tokens any chat template puts after an answer's text and before the next user
    message's text, found by rendering a probe exchange with two different next messages
    (their common part is the template's); () when the template does not end an answer
    with its own text (then nothing is warmed)."""
    question = ChatMessage("user", "Q")
    answer = "Fine."
    head = prompt_tokens((question,))
    tail = [*head, *tokenize(answer)]
    a, b = (
        prompt_tokens((question, ChatMessage("assistant", answer), ChatMessage("user", text)))
        for text in ("A", "B")
    )
    common = a[: common_prefix(a, b)]
    if common[: len(tail)] != tail:
        return ()
    return tuple(common[len(tail) :])


@dataclass
class Tail:
    slot: Slot
    held: int  # tokens the slot held when its answer ended
    stamp: int  # the slot's last_used then: a later claim changes it
    tokens: list[int]
    due: float


class TurnTails:
    """Finished answers whose next turn's template tokens are still to be decoded."""

    def __init__(self, n_ctx_per_seq: int, grace_s: float = GRACE_S) -> None:
        self.n_ctx_per_seq = n_ctx_per_seq
        self.grace_s = grace_s
        self.pending: dict[int, Tail] = {}  # by id(slot): a slot's newest answer only

    def note(self, job: Job, reason: FinishReason) -> None:
        """A job ended and released its slot: if its conversation may come back (an answer
        that ended at an end-of-turn token or at max_tokens, not at a stop string), queue its
        next turn's template tokens, after the answer's last sampled token when it was cut
        at max_tokens (that one is not in KV yet)."""
        due = time.monotonic() + self.grace_s
        for t in self.pending.values():  # the engine was busy until now: the pause restarts
            t.due = due
        slot = job.slot
        if reason not in ("stop", "length") or not job.separator or slot is None:
            return
        if job.stream is None or job.stream.stopped or slot.cache_key is None:
            return
        tokens = [*([job.last] if reason == "length" else []), *job.separator]
        if len(slot.tokens) + len(tokens) >= self.n_ctx_per_seq:
            return
        self.pending[id(slot)] = Tail(slot, len(slot.tokens), slot.last_used, tokens, due)

    def wait_s(self) -> float | None:
        """Seconds until the earliest tail is due (None: nothing pending)."""
        if not self.pending:
            return None
        return max(0.0, min(t.due for t in self.pending.values()) - time.monotonic())

    def warm(self, ctx: Context, batch: Batch, table: SlotTable) -> None:
        """Decode the earliest due tail whose slot is as its answer left it. One
        conversation a call: the scheduler looks at its inbox between two."""
        now = time.monotonic()
        for key, t in sorted(self.pending.items(), key=lambda kv: kv[1].due):
            if t.due > now:
                return
            del self.pending[key]
            s = t.slot
            # a claim moves last_used; a clear drops the key; a cut shortens the tokens
            fresh = not s.busy and s.last_used == t.stamp and s.cache_key is not None
            if not fresh or len(s.tokens) != t.held or len(t.tokens) > batch.capacity:
                continue  # the slot was claimed, parked or cut since: nothing to warm
            batch.clear()
            for k, tok in enumerate(t.tokens):
                batch.add(tok, t.held + k, s.seq, False)
            if ctx.decode(batch) != DECODE_OK:  # whatever llama.cpp kept of it: not ours
                ctx.seq_rm(s.seq, t.held, -1)
                return
            table.append(s, t.tokens)
            return
