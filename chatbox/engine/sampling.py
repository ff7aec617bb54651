"""Per-sequence llama.cpp sampler chains built from SamplingParams."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterable

import llama_cpp

from chatbox.engine.types import SamplingParams

PENALTY_LAST_N = 64


class Sampler:
    """One request's sampler chain: penalties -> top_k -> top_p -> min_p -> temp -> dist.

    temperature <= 0 means greedy. The chain is owned by the decode thread.
    """

    def __init__(self, params: SamplingParams, n_vocab: int) -> None:
        chain_params = llama_cpp.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self.ptr = llama_cpp.llama_sampler_chain_init(chain_params)
        add = llama_cpp.llama_sampler_chain_add
        p = params
        if p.repeat_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0:
            add(
                self.ptr,
                llama_cpp.llama_sampler_init_penalties(
                    n_vocab,
                    PENALTY_LAST_N,
                    max(p.repeat_penalty, 1e-3),
                    p.frequency_penalty,
                    p.presence_penalty,
                ),
            )
        if p.temperature <= 0.0:
            add(self.ptr, llama_cpp.llama_sampler_init_greedy())
        else:
            if p.top_k > 0:
                add(self.ptr, llama_cpp.llama_sampler_init_top_k(p.top_k))
            if 0.0 < p.top_p < 1.0:
                add(self.ptr, llama_cpp.llama_sampler_init_top_p(p.top_p, 1))
            if p.min_p > 0.0:
                add(self.ptr, llama_cpp.llama_sampler_init_min_p(p.min_p, 1))
            add(self.ptr, llama_cpp.llama_sampler_init_temp(p.temperature))
            seed = p.seed if p.seed is not None else random.getrandbits(32)
            add(self.ptr, llama_cpp.llama_sampler_init_dist(seed & 0xFFFFFFFF))

    def accept_prompt(self, tokens: Iterable[int]) -> None:
        """Let penalties see the tail of the prompt."""
        for t in list(tokens)[-PENALTY_LAST_N:]:
            llama_cpp.llama_sampler_accept(self.ptr, t)

    def sample(self, ctx_ptr: object, index: int) -> int:
        """Sample from the logits of batch row `index` (also accepts the token)."""
        return int(llama_cpp.llama_sampler_sample(self.ptr, ctx_ptr, index))

    def free(self) -> None:
        if self.ptr:
            llama_cpp.llama_sampler_free(self.ptr)
            self.ptr = None

    def __del__(self) -> None:  # pragma: no cover - safety net
        with contextlib.suppress(Exception):
            self.free()
