"""The Q8_0 serving copy of Q4_1/Q5_1 models: made once, reused, and answering the same."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from chatbox.catalog.gguf import read_model_file
from chatbox.catalog.requant import serving_path
from chatbox.engine.engine import LlamaEngine
from chatbox.engine.llama import quantize
from chatbox.engine.types import SamplingParams
from chatbox.settings import EngineSettings
from tests.engine.helpers import chat, generate, softmax

SETTINGS = EngineSettings(n_parallel=2, n_ctx=2048, n_ctx_per_seq=1024, n_batch=256, n_threads=1)


@pytest.fixture(scope="module")
def tiny_q4_1(tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("q41") / "tiny-q4_1.gguf"
    quantize(tiny_gguf, path, "Q4_1")
    assert read_model_file(path).quantization == "Q4_1"
    return path


def test_a_q4_1_model_is_served_from_one_cached_q8_0_copy(tiny_q4_1: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    served = serving_path(tiny_q4_1, cache)
    assert served != tiny_q4_1 and served.parent == cache
    assert read_model_file(served).quantization == "Q8_0"
    made = served.stat().st_mtime_ns
    assert serving_path(tiny_q4_1, cache) == served  # the second load reuses it
    assert served.stat().st_mtime_ns == made
    assert [p.name for p in cache.iterdir()] == [served.name]  # no temp files left


def test_a_changed_source_gets_a_new_copy(tiny_q4_1: Path, tmp_path: Path) -> None:
    source = tmp_path / "model.gguf"
    source.write_bytes(tiny_q4_1.read_bytes())
    first = serving_path(source, tmp_path / "cache")
    st = source.stat()
    os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    second = serving_path(source, tmp_path / "cache")
    assert second != first and second.exists()
    assert not first.exists()  # the stale copy does not pile up
    other = tmp_path / "elsewhere" / "model.gguf"  # same name, another file: its own copy
    other.parent.mkdir()
    other.write_bytes(tiny_q4_1.read_bytes())
    third = serving_path(other, tmp_path / "cache")
    assert third != second and third.exists() and second.exists()


def test_other_types_and_the_switch_leave_the_file_as_is(
    tiny_gguf: Path, tiny_q4_1: Path, tmp_path: Path
) -> None:
    assert serving_path(tiny_gguf, tmp_path) == tiny_gguf  # F32/F16: batches well already
    assert serving_path(tiny_q4_1, tmp_path, enabled=False) == tiny_q4_1
    assert not any(tmp_path.iterdir())


def test_an_unwritable_cache_serves_the_original(tiny_q4_1: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")
    assert serving_path(tiny_q4_1, blocker / "cache") == tiny_q4_1


@pytest.mark.model
async def test_the_default_models_copy_answers_like_the_original(
    smollm2_gguf: Path, tmp_path: Path
) -> None:
    copy = serving_path(smollm2_gguf, tmp_path)
    assert copy != smollm2_gguf, "the default model is Q4_1: it should get a copy"
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    prompts = [
        chat(q)
        for q in (
            "What is the capital of France?",
            "Name three fruits.",
            "Write a haiku about rain.",
            "Explain TCP in one sentence.",
        )
    ]
    results = []
    for path in (smollm2_gguf, copy):
        engine = LlamaEngine(path, "smollm2", SETTINGS)
        await engine.start()
        try:
            results.append([await generate(engine, p, greedy, capture_logits=1) for p in prompts])
        finally:
            await engine.stop()
            engine.close()
    for original, served in zip(*results, strict=True):
        a, b = original.logits[0], served.logits[0]
        pa, pb = softmax(a), softmax(b)
        if int(np.argmax(a)) == int(np.argmax(b)):
            assert original.chunks[0] == served.chunks[0]
        else:  # a flip only where the original's top two were within 0.05 of probability
            assert abs(float(pa[np.argmax(a)] - pa[np.argmax(b)])) < 0.05
        # The same distribution up to quantization noise: top-10 overlap, close logits.
        top_a, top_b = set(np.argsort(a)[-10:]), set(np.argsort(b)[-10:])
        assert len(top_a & top_b) >= 8, (top_a, top_b)
        assert float(np.max(np.abs(a - b))) < 0.1 * float(np.ptp(a)), np.max(np.abs(a - b))
        # KL(original || copy) of the first token: measured 0.003-0.013 nats on these.
        kl = float(np.sum(pa * (np.log(pa + 1e-12) - np.log(pb + 1e-12))))
        assert kl < 0.05, (kl, original.text, served.text)
