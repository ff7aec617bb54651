"""The attention kernel timed on this machine: the faster one is kept, remembered, and
served; what an admin set is never second-guessed."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest

from chatbox.engine import kernels
from chatbox.engine.engine import LlamaEngine
from chatbox.engine.llama import Model
from chatbox.settings import EngineSettings
from tests.engine.helpers import GREEDY, chat, generate

SETTINGS = EngineSettings(
    n_parallel=2,
    n_ctx=2048,
    n_ctx_per_seq=1024,
    n_batch=512,
    n_threads=2,
    park_bytes=0,
    kv_type="f16",  # a cache either kernel can read, so the choice is timed
)


def test_flash_attention_is_kept_only_when_clearly_faster() -> None:
    # flash far faster for new conversations and no slower deep in: flash
    use_flash, ratio = kernels.faster_is_flash(
        [10.2, 36.5, 13.9, 119.0, 85.0, 160.0], [6.0, 20.0, 12.0, 100.0, 80.0, 150.0]
    )
    assert use_flash and ratio < kernels.FLASH_MARGIN
    # as timed on an AMD EPYC (2 cores): flash faster for new conversations, twice as slow
    # for a follow-up deep in: plain attention
    use_flash, ratio = kernels.faster_is_flash(
        [10.2, 36.5, 13.9, 119.0, 85.0, 80.6], [8.8, 30.0, 19.2, 120.9, 80.0, 162.7]
    )
    assert not use_flash and 1.0 < ratio < 1.2
    # a near tie, which on a shared machine is noise: plain attention
    use_flash, ratio = kernels.faster_is_flash([10.0] * 6, [9.5] * 6)
    assert not use_flash and kernels.FLASH_MARGIN < ratio < 1.0
    # as timed on another 2-core machine, where plain attention was far cheaper deep in
    use_flash, ratio = kernels.faster_is_flash(
        [7.1, 36.0, 12.6, 72.0, 85.0, 90.0], [6.9, 34.0, 23.3, 127, 153, 180.0]
    )
    assert not use_flash and ratio > 1.2


def test_both_kernels_are_timed_on_every_shape(tiny_gguf: Path) -> None:
    model = Model(tiny_gguf)
    try:
        for flash, ubatch in ((False, 256), (True, 512)):
            times = kernels.time_kernel(model, 1, flash, ubatch)
            assert len(times) == len(kernels.SHAPES) and all(0 < t < 5 for t in times)
    finally:
        model.close()


def test_the_verdict_is_remembered_per_model_and_machine(
    tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "kernels.json"
    model = Model(tiny_gguf)
    try:
        verdict = kernels.choose(model, 1, 256, 512, cache)
        entry = json.loads(cache.read_text())[kernels.machine_key(tiny_gguf, 1)]
        assert entry["flash"] is verdict and len(entry["plain_ms"]) == len(kernels.SHAPES)

        def not_again(*_: object) -> list[float]:
            raise AssertionError("timed again")

        monkeypatch.setattr(kernels, "time_kernel", not_again)
        assert kernels.choose(model, 1, 256, 512, cache) is verdict  # remembered: nothing timed
        key = kernels.machine_key
        assert key(tiny_gguf, 2) != key(tiny_gguf, 1)  # other threads: timed anew
        cache.write_text("{not json")  # a damaged file is timed afresh, not an error
        with pytest.raises(AssertionError, match="timed again"):
            kernels.choose(model, 1, 256, 512, cache)
    finally:
        model.close()


def threads_now() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_the_timing_leaves_no_worker_threads_behind(tiny_gguf: Path, tmp_path: Path) -> None:
    # llama.cpp's OpenMP workers belong to the thread that started them: left running, they
    # would outnumber the cores and slow every later step
    model = Model(tiny_gguf)
    try:
        before = threads_now()
        kernels.choose_apart(partial(kernels.choose, model, 2, 256, 512, tmp_path / "kernels.json"))
        deadline = time.monotonic() + 5  # the workers are told to exit; they may take a moment
        while threads_now() > before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert threads_now() == before
        assert (tmp_path / "kernels.json").is_file()
    finally:
        model.close()


def remember(cache: Path, model: Path, threads: int, flash: bool) -> None:
    cache.write_text(json.dumps({kernels.machine_key(model, threads): {"flash": flash}}))


async def answer(engine: LlamaEngine) -> str:
    await engine.start()
    try:
        return (await generate(engine, chat("Count to five."), sampling=GREEDY)).text
    finally:
        await engine.stop()


async def test_the_engine_serves_with_the_faster_kernel(tiny_gguf: Path, tmp_path: Path) -> None:
    cache = tmp_path / "kernels.json"
    texts = {}
    for flash in (True, False):
        remember(cache, tiny_gguf, 2, flash)
        engine = LlamaEngine(tiny_gguf, "tiny", replace(SETTINGS, kernel_cache=cache))
        try:
            texts[flash] = await answer(engine)
            assert engine.settings.flash_attn is flash
            assert engine.settings.n_ubatch == (512 if flash else 256)  # plain: 256-token passes
        finally:
            engine.close()
    assert texts[True] and texts[False]


async def test_a_configured_kernel_is_never_timed(tiny_gguf: Path, tmp_path: Path) -> None:
    cache = tmp_path / "kernels.json"
    for configured in (True, False):
        settings = replace(SETTINGS, kernel_cache=cache, flash_attn=configured)
        engine = LlamaEngine(tiny_gguf, "tiny", settings)
        try:
            assert await answer(engine)
            assert engine.settings.flash_attn is configured
        finally:
            engine.close()
    # a quantized cache needs flash attention: nothing to time either
    engine = LlamaEngine(tiny_gguf, "tiny", replace(SETTINGS, kernel_cache=cache, kv_type="q8_0"))
    try:
        assert await answer(engine)
        assert engine.settings.flash_attn is True
    finally:
        engine.close()
    assert not cache.exists()
