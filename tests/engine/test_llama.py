"""The llama.cpp wrapper (chatbox/engine/llama.py) and the build it runs on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from chatbox.engine.llama import Batch, Context, ContextParams, Model


def _decode(
    ctx: Context, batch: Batch, tokens: list[int], at: int, seq: int, step: int
) -> np.ndarray:
    """Decode `tokens` at positions from `at` into `seq`, `step` at a time; the last logits."""
    for start in range(0, len(tokens), step):
        batch.clear()
        for k, tok in enumerate(tokens[start : start + step]):
            batch.add(tok, at + start + k, seq, start + k == len(tokens) - 1)
        assert ctx.decode(batch) == 0
    return ctx.logits(batch.n - 1)


@pytest.mark.parametrize("kv_type", ["q8_0", "f16"])
def test_a_batched_prompt_reads_the_cache_as_a_token_at_a_time_does(
    tiny_gguf: Path, kv_type: str
) -> None:
    # ggml's tiled flash kernel takes 64 query rows or more over f16, 10 or more over q8_0 (our
    # patched build, scripts/patches/); single tokens take the untiled one: same answers.
    model = Model(tiny_gguf, n_gpu_layers=0)
    params = ContextParams(
        n_ctx=2 * 1024,
        n_seq_max=2,
        n_batch=512,
        n_ubatch=512,
        n_threads=2,
        flash_attn=True,
        kv_type=kv_type,
        kv_unified=False,
    )
    ctx = Context(model, params)
    batch = Batch(512)
    try:
        text = "the cache keeps every turn of the conversation so far; " * 20
        tokens = model.tokenize(text)[:400]
        assert len(tokens) == 400
        prompt, follow_up = tokens[:388], tokens[388:]  # a 12-token follow-up deep in it
        batched = [
            _decode(ctx, batch, prompt, 0, 0, 128),
            _decode(ctx, batch, follow_up, 388, 0, 12),
        ]
        single = [_decode(ctx, batch, prompt, 0, 1, 1), _decode(ctx, batch, follow_up, 388, 1, 1)]
        for got, want in zip(batched, single, strict=True):
            assert got.argmax() == want.argmax()
            np.testing.assert_allclose(got, want, atol=0.02 * float(np.abs(want).max()))
    finally:
        batch.free()
        ctx.close()
        model.close()
