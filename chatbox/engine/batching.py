"""What one decode step holds: every stream's next token (plus its guesses), then prompt
chunks of new requests, as many as the prefill pacer allows."""

from __future__ import annotations

from chatbox.engine.job import Job
from chatbox.engine.llama import Batch
from chatbox.engine.pacing import PrefillPacer, prefill_budget
from chatbox.engine.speculative import step as speculative
from chatbox.engine.speculative.stepcost import StepCosts

# Guesses pay only while a step is small. With more streams decoding, a CPU step is
# compute-bound and every guessed row costs nearly what a real token does; on a GPU, where
# such a step is far from compute-bound, this is the limit to raise.
MAX_DRAFT_STREAMS = 2

# One job's share of a batch: the tokens it adds to its slot, and the batch row whose
# logits it samples next (None: a prompt chunk that is not the prompt's last).
Row = tuple[Job, list[int], int | None]


def build_batch(
    batch: Batch,
    active: list[Job],
    pacer: PrefillPacer,
    starved: bool,
    n_ctx_per_seq: int,
    costs: StepCosts | None = None,
) -> list[Row]:
    """Fill `batch` for the next step. While the KV cache is starved, streams run without
    guesses and prompts wait (the scheduler sets `starved` until something finishes).
    With `costs`, a stream guesses only as far as its guesses pay for their rows."""
    batch.clear()
    decoding: list[Job] = []
    prefilling: list[Job] = []
    for j in active:  # one pass and no sort for the usual step: the decode thread's time
        if j.pending is None:
            prefilling.append(j)
        elif j.slot is not None:
            decoding.append(j)
    if len(prefilling) > 1:
        prefilling.sort(key=lambda j: (j.request.priority, len(j.prompt) - j.n_done))
    spare = (batch.capacity - len(decoding)) // max(1, len(decoding))
    # No guesses in a step that also prefills: it is compute-bound already, so a guessed
    # row costs what a prompt token does and delays the new answer's first token.
    crowded = (
        starved or len(decoding) > MAX_DRAFT_STREAMS or any(j.slot is not None for j in prefilling)
    )
    # What each job adds, decided in priority order; rows are then added in order of
    # sequence id: with a stream per slot llama.cpp packs one pass per run of consecutive
    # ids, taken in the order they first appear in the batch.
    plan: list[tuple[Job, list[int], bool]] = []  # job, tokens, whether it is decoding
    cost = None
    if costs is not None and not crowded and decoding:
        depth = 1 + max(len(j.slot.tokens) for j in decoding if j.slot)
        cost = costs.for_step(len(decoding), depth)
    for job in decoding:
        assert job.pending is not None and job.slot is not None
        job.draft = [] if crowded else speculative.draft(job, spare, n_ctx_per_seq, cost)
        plan.append((job, [job.pending, *job.draft], True))
    room = batch.capacity - sum(len(toks) for _, toks, _ in plan)
    budget = 0 if (plan and starved) else prefill_budget(pacer, decoding, prefilling, room)
    for job in prefilling:
        if budget <= 0 or job.slot is None:
            break
        chunk = job.prompt[job.n_done : job.n_done + budget]
        plan.append((job, chunk, False))
        budget -= len(chunk)
    rows: list[Row] = []
    if len(plan) > 1:
        plan.sort(key=lambda p: p[0].slot.seq if p[0].slot else 0)
    for job, toks, is_decoding in plan:
        assert job.slot is not None
        seq = job.slot.seq
        if is_decoding:  # the next token, then each guess with its own logits row
            pos = len(job.slot.tokens)
            row = batch.add(toks[0], pos, seq, True)
            for k, tok in enumerate(toks[1:]):
                batch.add(tok, pos + 1 + k, seq, True)
            rows.append((job, toks[:1], row))
            continue
        last = job.n_done + len(toks) == len(job.prompt)
        idx: int | None = None
        for k, tok in enumerate(toks):
            want = last and k == len(toks) - 1
            i = batch.add(tok, job.n_done + k, seq, want)
            if want:
                idx = i
        rows.append((job, toks, idx))
    return rows


def deepest(rows: list[Row]) -> int:
    """The most KV cells a token of the step attends to (its sequence's length after it)."""
    return max((len(j.slot.tokens) + len(t) for j, t, _ in rows if j.slot is not None), default=0)
