"""The speculative step of prompt-lookup decoding: what to guess, and which guesses stand.

`lookup.Drafter` proposes tokens; the scheduler decodes them after the stream's pending
token, one logits row each; `verify` then samples those rows in order and keeps the
longest prefix the sampler agrees with, so the output is distributed exactly as without
drafting. The decode thread's own work (sampling a row, finishing a job) comes in as
arguments, so this module knows nothing of the scheduler.
"""

from __future__ import annotations

from collections.abc import Callable

from chatbox.engine.job import Job
from chatbox.engine.kv.slots import SlotTable
from chatbox.engine.llama import Context
from chatbox.engine.speculative.stepcost import StepRatio
from chatbox.engine.types import FinishReason

# Sample one logits row of a job: the token, and why the job ends (None: it goes on).
SampleRow = Callable[[Job, int], tuple[int, FinishReason | None]]


def draft(job: Job, spare: int, n_ctx_per_seq: int, cost: StepRatio | None = None) -> list[int]:
    """Prompt-lookup guesses to decode after job.pending (within the batch and limits, and
    only as many as pay for their rows where `cost` says what rows cost)."""
    if job.drafter is None or job.slot is None:
        return []
    left = job.request.sampling.max_tokens - job.n_generated - 1
    room = min(spare, left, n_ctx_per_seq - len(job.slot.tokens) - 2)
    return job.drafter.draft(room, cost) if room > 0 else []


def verify(
    job: Job, idx: int, sample: SampleRow, slots: SlotTable, ctx: Context
) -> tuple[int, FinishReason | None]:
    """Sample the rows of job's last decode: its next token, then one per guess for as
    long as the sampler agrees with the guesses. Rejected guesses' cells are removed.
    Returns how many guesses were right, and why the job ends (None: it goes on)."""
    assert job.slot is not None
    guesses, accepted, reason = job.draft, 0, None
    for i in range(len(guesses) + 1):
        tok, reason = sample(job, idx + i)
        if job.drafter is not None and reason is None:
            job.drafter.push(tok)
        if reason is not None or i == len(guesses) or tok != guesses[i]:
            break
        slots.append(job.slot, [tok])  # a right guess: its cell is already in KV
        accepted += 1
    if accepted < len(guesses):
        ctx.seq_rm(job.slot.seq, len(job.slot.tokens), -1)
    if guesses and job.drafter is not None:
        job.drafter.record(len(guesses), accepted)
    return accepted, reason
