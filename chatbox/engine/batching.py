"""What one decode step holds: every stream's next token (plus its guesses), then prompt
chunks of new requests, as many as the prefill pacer allows."""

from __future__ import annotations

from chatbox.engine import speculative
from chatbox.engine.job import Job
from chatbox.engine.llama import Batch
from chatbox.engine.pacing import PrefillPacer, prefill_budget

# Guesses pay only while a step is small. With more streams decoding, a CPU step is
# compute-bound and every guessed row costs nearly what a real token does (measured on 2
# cores with 8 streams guessing: 0.91x on plain chat, 1.02x on an answer copying its prompt).
MAX_DRAFT_STREAMS = 2

# One job's share of a batch: the tokens it adds to its slot, and the batch row whose
# logits it samples next (None: a prompt chunk that is not the prompt's last).
Row = tuple[Job, list[int], int | None]


def build_batch(
    batch: Batch, active: list[Job], pacer: PrefillPacer, starved: bool, n_ctx_per_seq: int
) -> list[Row]:
    """Fill `batch` for the next step. While the KV cache is starved, streams run without
    guesses and prompts wait (the scheduler sets `starved` until something finishes)."""
    batch.clear()
    rows: list[Row] = []
    decoding = [j for j in active if j.pending is not None and j.slot is not None]
    prefilling = sorted(
        (j for j in active if j.pending is None),
        key=lambda j: (j.request.priority, len(j.prompt) - j.n_done),
    )
    spare = (batch.capacity - len(decoding)) // max(1, len(decoding))
    # No guesses in a step that also prefills: it is compute-bound already, so a guessed
    # row costs what a prompt token does and delays the new answer's first token.
    crowded = (
        starved or len(decoding) > MAX_DRAFT_STREAMS or any(j.slot is not None for j in prefilling)
    )
    for job in decoding:
        assert job.pending is not None and job.slot is not None
        pos, seq = len(job.slot.tokens), job.slot.seq
        row = batch.add(job.pending, pos, seq, True)
        job.draft = [] if crowded else speculative.draft(job, spare, n_ctx_per_seq)
        for k, tok in enumerate(job.draft):
            batch.add(tok, pos + 1 + k, seq, True)  # each guess gets its own logits row
        rows.append((job, [job.pending], row))
    room = batch.capacity - batch.n
    budget = (
        0
        if (rows and starved)
        else prefill_budget(pacer, [job for job, _, _ in rows], prefilling, room)
    )
    for job in prefilling:
        if budget <= 0 or job.slot is None:
            break
        chunk = job.prompt[job.n_done : job.n_done + budget]
        last = job.n_done + len(chunk) == len(job.prompt)
        idx: int | None = None
        seq = job.slot.seq
        for k, tok in enumerate(chunk):
            want = last and k == len(chunk) - 1
            i = batch.add(tok, job.n_done + k, seq, want)
            if want:
                idx = i
        rows.append((job, chunk, idx))
        budget -= len(chunk)
    return rows
