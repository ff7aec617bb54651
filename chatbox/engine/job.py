"""A request as the decode thread sees it: the `Job` record and its per-request state."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from chatbox.engine.detok import StopTextStream
from chatbox.engine.kv.slots import Slot
from chatbox.engine.llama import Model
from chatbox.engine.sampling import Sampler
from chatbox.engine.speculative.lookup import Drafter, Prior
from chatbox.engine.types import EngineEvent, GenerationRequest, Timings, TokenLogprob


@dataclass(eq=False)
class Job:
    """One request as the decode thread sees it."""

    request: GenerationRequest
    prompt: list[int]
    sink: Callable[[EngineEvent], None]  # thread-safe delivery to the asyncio side
    public: int = 0  # leading prompt tokens other scopes may share (GenerationRequest)
    separator: tuple[int, ...] = ()  # the next turn's template tokens, warmed after (turns.py)
    order: int = 0
    capture_logits: int = 0  # test hook: keep the logits of the first N sampled positions
    ignore_eog: bool = False  # benchmark hook: run to max_tokens even past end-of-turn
    lstrip: bool = False  # transcript prompts: the answer's first token carries a space
    logits: list[np.ndarray] = field(default_factory=list)
    cancelled: bool = False
    done: bool = False
    slot: Slot | None = None
    n_done: int = 0  # prompt tokens in KV
    cached: int = 0
    sampler: Sampler | None = None
    stream: StopTextStream | None = None
    pending: int | None = None  # sampled token waiting to be decoded
    last: int = -1  # the token sampled last
    drafter: Drafter | None = None  # prompt-lookup decoding (None: off)
    draft: list[int] = field(default_factory=list)  # guesses decoded after pending this step
    n_generated: int = 0
    t_submit: float = field(default_factory=time.perf_counter)
    t_last: float = 0.0
    t_admit: float = 0.0  # given a slot
    t_first: float = 0.0  # first token sampled
    forks: list[Job] = field(default_factory=list)  # more answers to this prompt (n > 1)
    held: list[TokenLogprob] = field(default_factory=list)  # logprobs of text not yet emitted

    def __lt__(self, other: Job) -> bool:
        return (self.request.priority, self.order) < (other.request.priority, other.order)


def start_sampling(
    job: Job, model: Model, see_prompt: bool, lookup_draft: int = 0, prior: Prior | None = None
) -> None:
    """Give a job that just got its slot a sampler chain, a stop-text stream and (when
    prompt-lookup decoding is on) a drafter, its estimates starting from `prior`.
    `see_prompt` lets repetition penalties see the prompt's tail; forks (forks.py) start
    without it and without a drafter."""
    job.sampler = Sampler(job.request.sampling, model.n_vocab, model.vocab)
    if see_prompt:
        job.sampler.accept_prompt(job.prompt)
    job.stream = StopTextStream(job.request.sampling.stop, job.lstrip)
    if lookup_draft > 0:
        job.drafter = Drafter(job.prompt, lookup_draft, prior)


def timings(job: Job) -> Timings:
    """Where a finished job's time went: waiting for a slot, prefill, decode."""
    end = time.perf_counter()
    admit = job.t_admit or end
    first = job.t_first or end
    return Timings(admit - job.t_submit, max(0.0, first - admit), max(0.0, end - first))
