"""Sampler chains (sampling.py): the greedy shortcut picks what llama.cpp's greedy picks."""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from chatbox.engine.llama import Batch, Context, ContextParams, Model
from chatbox.engine.sampling import Sampler
from chatbox.engine.types import SamplingParams


def test_greedy_takes_the_argmax_that_llama_cpp_would(tiny_gguf: Path) -> None:
    """Step by step along a greedy answer, the shortcut's token is the one llama.cpp's own
    greedy chain samples from the same logits row; a chain with a penalty is still run."""
    model = Model(tiny_gguf)
    ctx = Context(model, ContextParams(n_ctx=256, n_seq_max=1, n_batch=64, n_threads=1))
    batch = Batch(64)
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
    greedy = Sampler(SamplingParams(temperature=0.0), model.n_vocab, model.vocab)
    penalised = Sampler(
        SamplingParams(temperature=0.0, repeat_penalty=1.3), model.n_vocab, model.vocab
    )
    try:
        assert greedy.argmax and not penalised.argmax
        prompt = model.tokenize("<|im_start|>user\nCount to ten.<|im_end|>\n", parse_special=True)
        for i, tok in enumerate(prompt):
            batch.add(tok, i, 0, i == len(prompt) - 1)
        assert ctx.decode(batch) == 0
        pos, row, seen = len(prompt), batch.n - 1, set()
        for _ in range(24):
            tok = greedy.sample(ctx, row)
            assert tok == llama_cpp.llama_sampler_sample(chain, ctx.ptr, row)
            seen.add(tok)
            batch.clear()
            batch.add(tok, pos, 0, True)
            assert ctx.decode(batch) == 0
            pos, row = pos + 1, 0
        assert len(seen) > 1  # the answer moved on: the rows compared were not all alike
    finally:
        llama_cpp.llama_sampler_free(chain)
        greedy.free()
        penalised.free()
        batch.free()
        ctx.close()
        model.close()


class _Row:
    """A stand-in context: one logits row (the grammar path reads only the row)."""

    def __init__(self, logits: np.ndarray) -> None:
        self.logits = logits
        self.ptr = None

    def row(self, index: int) -> np.ndarray:
        return self.logits


def test_a_grammar_checks_the_pick_and_filters_the_vocabulary_only_when_it_refuses_it(
    tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole-vocabulary grammar pass (~15 ms a step on a 49k vocabulary) runs only when
    the chain's own pick breaks the grammar; either way the token is the best one allowed."""
    model = Model(tiny_gguf)
    digits = [model.tokenize(d, add_special=False, parse_special=False)[0] for d in "0123456789"]
    letter = model.tokenize("x", add_special=False, parse_special=False)[0]
    sampler = Sampler(
        SamplingParams(temperature=0.0, grammar="root ::= [0-9]+"), model.n_vocab, model.vocab
    )
    filtered: list[bool] = []
    pick = Sampler._pick

    def spy(self: Sampler, logits: np.ndarray, grammar: bool) -> int:
        filtered.append(grammar)
        return pick(self, logits, grammar)

    monkeypatch.setattr(Sampler, "_pick", spy)
    try:
        logits = np.zeros(model.n_vocab, dtype=np.float32)
        logits[digits[7]] = 5.0  # the likeliest token is allowed: checked, not filtered
        assert sampler.sample(_Row(logits), 0) == digits[7]  # type: ignore[arg-type]
        assert filtered == [False]
        logits[letter] = 9.0  # now a letter is likelier: refused, then the best digit
        assert sampler.sample(_Row(logits), 0) == digits[7]  # type: ignore[arg-type]
        assert filtered == [False, False, True]
    finally:
        sampler.free()
        model.close()


def test_a_grammar_at_temperature_draws_from_the_models_distribution(tiny_gguf: Path) -> None:
    """Sampling under a grammar with top-k, top-p and a temperature picks what the model
    favours among the tokens the grammar allows, pick after pick: top-k sorts the candidate
    array in place, and a pick that reused the sorted ids paired logits with the wrong
    tokens (answers read as random tokens at any temperature above 0)."""
    model = Model(tiny_gguf)
    digits = [model.tokenize(d, add_special=False, parse_special=False)[0] for d in "0123456789"]
    letter = model.tokenize("x", add_special=False, parse_special=False)[0]
    sampler = Sampler(
        SamplingParams(temperature=0.7, top_k=40, top_p=0.95, seed=3, grammar="root ::= [0-9]+"),
        model.n_vocab,
        model.vocab,
    )
    try:
        rng = np.random.default_rng(0)
        picks = []
        for _ in range(40):
            logits = rng.normal(0.0, 1.0, model.n_vocab).astype(np.float32)
            logits[digits[3]] = 14.0  # the model's clear favourite among the digits
            logits[letter] = 16.0 if len(picks) % 2 else 0.0  # a likelier token, refused
            picks.append(sampler.sample(_Row(logits), 0))  # type: ignore[arg-type]
        assert all(p in digits for p in picks)
        assert picks.count(digits[3]) >= 36, picks
    finally:
        sampler.free()
        model.close()
