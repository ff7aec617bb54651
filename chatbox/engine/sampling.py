"""Per-sequence llama.cpp sampler chains built from SamplingParams."""

from __future__ import annotations

import contextlib
import ctypes
import random
from collections.abc import Iterable

import llama_cpp
import numpy as np

from chatbox.engine.llama import Context
from chatbox.engine.types import GrammarError, SamplingParams

PENALTY_LAST_N = 64
# llama_token_data's layout: a candidates array numpy fills and llama.cpp reads in place
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


def _grammar_sampler(vocab: object, grammar: str, triggers: tuple[str, ...]) -> object:
    """llama.cpp's grammar sampler; with triggers it is lazy (free text until a match)."""
    text = grammar.encode()
    if triggers:
        patterns = (ctypes.c_char_p * len(triggers))(*(t.encode() for t in triggers))
        no_tokens = (llama_cpp.llama_token * 0)()
        ptr = llama_cpp.llama_sampler_init_grammar_lazy_patterns(
            vocab, text, b"root", patterns, len(triggers), no_tokens, 0
        )
    else:
        ptr = llama_cpp.llama_sampler_init_grammar(vocab, text, b"root")
    if not ptr:
        raise GrammarError("the grammar could not be compiled")
    return ptr


def check_grammar(vocab: object, grammar: str, triggers: tuple[str, ...] = ()) -> None:
    """Raise GrammarError if llama.cpp cannot compile the grammar (before queueing)."""
    llama_cpp.llama_sampler_free(_grammar_sampler(vocab, grammar, triggers))


def top_logprobs(logits: np.ndarray, token: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """The token's log-probability under the raw logits row, and the k likeliest tokens."""
    row = logits.astype(np.float64)
    shifted = row - row.max()
    logz = float(np.log(np.exp(shifted).sum()))
    logp = shifted - logz
    top: list[tuple[int, float]] = []
    if k > 0:
        ids = np.argpartition(-logp, min(k, len(logp) - 1))[:k]
        ids = ids[np.argsort(-logp[ids], kind="stable")]
        top = [(int(i), min(0.0, float(logp[i]))) for i in ids]
    return min(0.0, float(logp[token])), top


class Sampler:
    """One request's sampler chain: logit bias -> penalties -> top_k -> top_p -> min_p ->
    temp -> dist, and a grammar that checks its pick.

    temperature <= 0 means greedy. The chain is owned by the decode thread.

    The grammar checks only the token the chain picked, and filters the whole vocabulary
    only when it refuses that one (then the chain picks again), as llama.cpp's own sampler
    does: llama.cpp's grammar decodes every candidate's text against every open
    alternative, ~15 ms a step on a 49k vocabulary, against microseconds for one token.

    A chain that is greedy alone is not run: the token is the argmax of the logits row.
    llama_sampler_sample copies the whole row into a candidate array first, which in the
    decode loop (caches cold after a decode) costs about twice the argmax, once per stream
    per step.
    """

    def __init__(self, params: SamplingParams, n_vocab: int, vocab: object = None) -> None:
        chain_params = llama_cpp.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self.ptr = llama_cpp.llama_sampler_chain_init(chain_params)
        self._penalties: object = None
        add = llama_cpp.llama_sampler_chain_add
        p = params
        bias = [(t, b) for t, b in p.logit_bias if 0 <= t < n_vocab]
        if bias:
            arr = (llama_cpp.llama_logit_bias * len(bias))(
                *(llama_cpp.llama_logit_bias(t, b) for t, b in bias)
            )
            add(self.ptr, llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(bias), arr))
        self._grammar: object = None  # checks the chain's pick (sample)
        self._candidates: np.ndarray | None = None  # llama_token_data per token, reused
        self._ids: np.ndarray = np.zeros(0, dtype=np.int32)
        if p.grammar:
            self._grammar = _grammar_sampler(vocab, p.grammar, p.grammar_triggers)
        if p.repeat_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0:
            self._penalties = llama_cpp.llama_sampler_init_penalties(
                n_vocab,
                PENALTY_LAST_N,
                max(p.repeat_penalty, 1e-3),
                p.frequency_penalty,
                p.presence_penalty,
            )
            add(self.ptr, self._penalties)
        # the argmax is what greedy picks (the first of equal maxima, as np.argmax)
        self.argmax = p.temperature <= 0.0 and not (bias or p.grammar or self._penalties)
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
        """Let penalties see the tail of the prompt (only them: a grammar would reject it)."""
        if self._penalties is None:
            return
        for t in list(tokens)[-PENALTY_LAST_N:]:
            llama_cpp.llama_sampler_accept(self._penalties, t)

    def sample(self, ctx: Context, index: int) -> int:
        """Sample from the logits of batch row `index` (also accepts the token)."""
        if self.argmax:
            return int(ctx.row(index).argmax())
        if self._grammar is None:
            return int(llama_cpp.llama_sampler_sample(self.ptr, ctx.ptr, index))
        logits = ctx.row(index)
        token = self._pick(logits, grammar=False)
        one = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 1.0, 0.0))
        single = llama_cpp.llama_token_data_array(one, 1, -1, False)
        llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(single))
        if one[0].logit == -np.inf:  # refused: the grammar filters every token, then pick
            token = self._pick(logits, grammar=True)
        llama_cpp.llama_sampler_accept(self._grammar, token)
        llama_cpp.llama_sampler_accept(self.ptr, token)
        return token

    def _pick(self, logits: np.ndarray, grammar: bool) -> int:
        """The chain's pick from a logits row (the grammar filtering first if `grammar`)."""
        cands = self._candidates
        if cands is None or len(cands) != len(logits):
            cands = self._candidates = np.zeros(len(logits), dtype=_TOKEN_DATA)
            self._ids = np.arange(len(logits), dtype=np.int32)
        # top-k and top-p sort the array in place: each pick starts from the ids in order again
        cands["id"] = self._ids
        cands["logit"] = logits
        cands["p"] = 0.0
        data = cands.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data))
        arr = llama_cpp.llama_token_data_array(data, len(cands), -1, False)
        if grammar:
            llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(arr))
        llama_cpp.llama_sampler_apply(self.ptr, ctypes.byref(arr))
        return int(arr.data[arr.selected].id)

    def free(self) -> None:
        if self.ptr:
            llama_cpp.llama_sampler_free(self.ptr)
            self.ptr = None
        if self._grammar:
            llama_cpp.llama_sampler_free(self._grammar)
            self._grammar = None

    def __del__(self) -> None:  # pragma: no cover - safety net
        with contextlib.suppress(Exception):
            self.free()
