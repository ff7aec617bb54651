"""The context's shape from the settings: the prefix cache survives a small --n-ctx, a
configuration that cannot keep it says so, and a lagging consumer gets tokens joined."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path

import pytest

from chatbox.cpu import URGENT
from chatbox.engine.engine import LlamaEngine
from chatbox.engine.llama import LlamaError, Model
from chatbox.engine.tuning import (
    EXPLORE_EVERY,
    MAX_EXPLORE_EVERY,
    MAX_EXPLORE_FEWER,
    SCORES_BYTES,
    UBATCH_NO_FLASH,
    ThreadTuner,
    attention,
    available_cores,
    decode_threads,
    kv_shape,
    park_budget,
    prefix_cache_warning,
    thread_choices,
)
from chatbox.engine.types import DoneEvent, GenerationRequest, TokenEvent
from chatbox.settings import EngineSettings
from tests.engine.helpers import GREEDY, chat, generate

# The `--n-ctx 4096` shape scaled down: the whole cache is one conversation's worth, and a
# quarter of it (the old idle budget) is less than the conversation below.
SMALL = EngineSettings(
    n_parallel=4,
    n_ctx=1024,
    n_ctx_per_seq=1024,
    n_batch=256,
    n_threads=2,
    park_bytes=0,
    kv_type="f16",  # a cache plain attention can read
)


async def started(path: Path, settings: EngineSettings) -> LlamaEngine:
    engine = LlamaEngine(path, "tiny", settings)
    await engine.start()
    return engine


async def test_follow_up_reuses_the_prefix_when_the_cache_holds_one_conversation(
    tiny_gguf: Path,
) -> None:
    engine = await started(tiny_gguf, SMALL)
    try:
        first = chat("Remember these notes. " + "The meeting moved to Tuesday. " * 20)
        r1 = await generate(engine, first, cache_key="conv")
        assert r1.done.usage.prompt_tokens > SMALL.n_ctx // 4  # longer than the old budget
        second = (*first, *chat("x", r1.text, "And the time?")[1:])
        r2 = await generate(engine, second, cache_key="conv")
        assert r2.done.usage.cached_tokens >= r1.done.usage.prompt_tokens - 1
    finally:
        await engine.stop()
        engine.close()


async def test_a_budget_below_one_conversation_is_reported_at_startup(
    tiny_gguf: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert prefix_cache_warning(SMALL, 1024, 1024) is None  # the default keeps it
    tight = replace(SMALL, idle_kv_cells=100)
    with caplog.at_level(logging.WARNING, logger="chatbox.engine.engine"):
        engine = await started(tiny_gguf, tight)
    try:
        warned = [r.getMessage() for r in caplog.records if "idle_kv_cells=100" in r.getMessage()]
        assert warned and "recomputed on every turn" in warned[0]
        parked = prefix_cache_warning(replace(tight, park_bytes=1 << 20), 1024, 1024)
        assert parked is not None and "parked in host RAM" in parked
    finally:
        await engine.stop()
        engine.close()


def test_plain_attention_on_cpu_with_a_stream_per_slot_and_flash_attention_elsewhere() -> None:
    cpu = EngineSettings(n_batch=512, kv_unified=False, kv_type="f16")
    chosen = attention(cpu, offloaded=False, n_head=9, n_ctx_per_seq=4096)
    assert chosen.flash_attn is False and chosen.n_ubatch == UBATCH_NO_FLASH
    # flash attention where it pays: a GPU, a shared pool (it skips other conversations'
    # cells), a quantized cache (llama.cpp needs it); passes stay whole batches then
    for case, offloaded in [
        (cpu, True),
        (replace(cpu, kv_unified=True), False),
        (replace(cpu, kv_type="q8_0"), False),
    ]:
        got = attention(case, offloaded=offloaded, n_head=9, n_ctx_per_seq=4096)
        assert got.flash_attn is True and got.n_ubatch == 512
    # a context so deep that plain attention's scores would not fit the budget
    deep = SCORES_BYTES // (UBATCH_NO_FLASH * 32 * 4) * 2
    assert attention(cpu, offloaded=False, n_head=32, n_ctx_per_seq=deep).flash_attn is True
    # what the admin set stands, and a pass is never larger than a step
    forced = attention(replace(cpu, flash_attn=True, n_ubatch=1024), False, 9, 4096)
    assert forced.flash_attn is True and forced.n_ubatch == 512
    assert attention(replace(cpu, flash_attn=False), True, 9, 4096).flash_attn is False
    # ...but a quantized cache has no plain-attention layout in llama.cpp
    assert attention(replace(cpu, flash_attn=False, kv_type="q8_0"), False, 9, 4096).flash_attn


async def test_plain_attention_in_split_passes_keeps_the_prefix_cache(tiny_gguf: Path) -> None:
    # a 512-token step in two passes
    settings = replace(SMALL, n_batch=512, n_parallel=2, n_ctx=4096, n_ctx_per_seq=2048)
    engine = await started(tiny_gguf, settings)
    try:
        assert engine.settings.flash_attn is False and engine.settings.n_ubatch == 256
        first = chat("Remember these notes. " + "The meeting moved to Tuesday. " * 40)
        r1 = await generate(engine, first, cache_key="conv")
        assert r1.done.finish_reason == "length" and r1.done.usage.prompt_tokens > 512
        second = (*first, *chat("x", r1.text, "And the time?")[1:])
        r2 = await generate(engine, second, cache_key="conv")
        assert r2.done.usage.cached_tokens >= r1.done.usage.prompt_tokens - 1
        assert r2.done.finish_reason == "length"
    finally:
        await engine.stop()
        engine.close()


async def test_tokens_that_queue_up_behind_a_slow_consumer_arrive_joined(
    tiny_gguf: Path,
) -> None:
    engine = await started(tiny_gguf, SMALL)
    try:
        msgs = chat("Count slowly.")
        fast = await generate(engine, msgs)
        await engine.clear_cache()
        gen = engine.submit(GenerationRequest(msgs, GREEDY, cache_scope="tester"))
        while engine.stats().running or engine.stats().queue_depth:
            await asyncio.sleep(0.01)  # the consumer is "busy" until the answer is complete
        await asyncio.sleep(0.05)
        events = [ev async for ev in gen]
        tokens = [ev for ev in events if isinstance(ev, TokenEvent)]
        assert isinstance(events[-1], DoneEvent)
        assert len(tokens) < fast.done.usage.completion_tokens  # fewer events than tokens...
        assert "".join(t.text for t in tokens) == fast.text  # ...the same answer
        # ...and each joined event keeps its tokens' own events (one OpenAI chunk each)
        parts = [p for t in tokens for p in (t.parts or (t,))]
        assert len(parts) > len(tokens) and all(not p.parts for p in parts)
        assert "".join(p.text for p in parts) == fast.text
    finally:
        await engine.stop()
        engine.close()


def test_every_core_to_start_with_unless_threads_are_set() -> None:
    assert decode_threads(0, 2) == (2, 2)
    assert decode_threads(0, 1) == (1, 1)
    assert decode_threads(3, 2) == (3, 3)


def run_steps(
    tuner: ThreadTuner, steps: int, n_tokens: int, cost: dict[int, float], depth: int = 0
) -> list[int]:
    """Drive the tuner as the decode thread does; `cost`: seconds per step per count."""
    used = []
    for _ in range(steps):
        threads = tuner.choose(n_tokens, depth)
        used.append(threads)
        tuner.observe(n_tokens, threads, cost[threads], depth)
    return used


def tries(used: list[int], best: int) -> list[int]:
    """The steps that tried another count than `best`."""
    return [i for i, t in enumerate(used) if t != best]


def test_the_thread_count_follows_what_is_measured_per_kind_of_step() -> None:
    tuner = ThreadTuner(2, (1, 2))  # a lone stream starting on one thread (as it once did)
    assert thread_choices(2) == (2, 1)
    # Here two turn out faster, so it moves to two at the first try (step 24) and then
    # only tries one again, less and less often.
    used = run_steps(tuner, 100, 1, {1: 0.010, 2: 0.006})
    assert used[:23] == [1] * 23 and used[23] == 2
    assert tries(used[24:], 2) == [47 - 24, 95 - 24]  # 24 steps after the switch, then 48
    # Batches of 8 start on two; two stay best: each losing try doubles the wait before
    # the next, up to MAX_EXPLORE_EVERY steps.
    used = run_steps(tuner, 1200, 8, {1: 0.040, 2: 0.025})
    at = tries(used, 2)
    gaps = [b - a for a, b in zip([-1, *at], at, strict=False)]
    e = EXPLORE_EVERY
    assert (e, MAX_EXPLORE_EVERY) == (24, 384)
    assert gaps == [e, 2 * e, 4 * e, 8 * e, 16 * e, MAX_EXPLORE_EVERY]
    # The box gets busy (two threads collapse): batches move to one thread at once and stay,
    # trying two again every MAX_EXPLORE_FEWER steps (not backing off as far as above).
    used = run_steps(tuner, 200, 8, {1: 0.045, 2: 0.300})
    assert used[1] == 1 and tries(used, 1) == [0, 25, 73, 121, 169]
    assert MAX_EXPLORE_FEWER == 48
    assert tuner.summary()["<=16"] == 1
    # ...and back when the load goes away; the one-token bucket was not disturbed.
    used = run_steps(tuner, 500, 8, {1: 0.040, 2: 0.025})
    assert tuner.summary()["<=16"] == 2 and used[-50:].count(2) >= 49
    assert tuner.summary()["<=1"] == 2


def test_steps_deep_in_a_long_conversation_do_not_decide_for_short_ones() -> None:
    # One-token steps at an 1,900-token depth cost ~2x those of a short conversation. When
    # both shared one average, a try of one thread on a short step right after a long
    # conversation's turn looked faster and took over: 48 of the next 100 short steps ran
    # on the slower count.
    tuner = ThreadTuner(2, (2, 2))
    deep = run_steps(tuner, 20, 1, {1: 0.035, 2: 0.022}, depth=1900)
    short = run_steps(tuner, 100, 1, {1: 0.015, 2: 0.010}, depth=60)
    assert deep == [2] * 20
    assert short.count(1) <= 2 and tries(short, 2) == [23, 71]  # lone tries that lost
    assert tuner.summary()["<=1"] == 2 and tuner.summary()["<=1 past 1024"] == 2
    # the deepest class is its own too
    assert ThreadTuner.bucket(1, 5000) != ThreadTuner.bucket(1, 2000) != ThreadTuner.bucket(1)


def test_a_difference_within_noise_does_not_flip_the_count() -> None:
    tuner = ThreadTuner(2, (2, 2))
    used = run_steps(tuner, 240, 8, {1: 0.0248, 2: 0.025})  # 1% apart
    assert tries(used, 2) == [23, 71, 167]  # each try lost: the waits doubled
    assert tuner.summary()["<=16"] == 2


def test_one_core_has_nothing_to_tune() -> None:
    tuner = ThreadTuner(1, (1, 1))
    assert run_steps(tuner, 50, 8, {1: 0.01}) == [1] * 50


async def test_tuned_threads_give_the_same_greedy_answers(tiny_gguf: Path) -> None:
    fixed = await started(tiny_gguf, replace(SMALL, n_threads=1))
    try:
        want = [await generate(fixed, chat(f"Tell me about {w}")) for w in ("owls", "tea")]
    finally:
        await fixed.stop()
        fixed.close()
    tuned = await started(tiny_gguf, replace(SMALL, n_threads=0))
    try:
        sched = tuned._scheduler
        assert sched is not None and sched.tuner is not None
        got = [await generate(tuned, chat(f"Tell me about {w}")) for w in ("owls", "tea")]
        assert sched.tuner.steps[0] > 0  # the one-token steps went through the tuner
    finally:
        await tuned.stop()
        tuned.close()
    assert [g.text for g in got] == [w.text for w in want]


async def test_urgent_work_in_the_process_gets_a_core_while_it_runs(tiny_gguf: Path) -> None:
    engine = await started(tiny_gguf, replace(SMALL, n_threads=2))
    try:
        sched = engine._scheduler
        assert sched is not None and sched.tuner is not None
        assert sched.tuner.choices == (2,)  # a configured count: nothing else is tried
        with URGENT.hold():
            during = await generate(engine, chat("Tell me about owls"))
            squeezed = sched.tuner.threads
        after = await generate(engine, chat("Tell me about owls"))
        assert squeezed == min(2, max(1, available_cores() - 1))
        assert sched.tuner.threads == 2  # back to the configured count
        assert during.text == after.text  # fewer threads, the same answer
    finally:
        await engine.stop()
        engine.close()


MB = 2**20


def test_the_kv_cache_is_n_ctx_shared_out_among_the_slots_unless_a_size_is_asked() -> None:
    s = EngineSettings(n_parallel=8, n_ctx=16384)  # the shipped shape
    assert kv_shape(s, 8, n_ctx_train=8192, cell_bytes=23040, available=0) == (16384, 2048)
    # a size asked per conversation is given to every slot, whatever n_ctx says
    asked = replace(s, n_ctx_per_seq=4096)
    assert kv_shape(asked, 8, 8192, 23040, 0) == (32768, 4096)
    # no more than the model was trained on
    assert kv_shape(replace(s, n_ctx=16384 * 8), 8, 8192, 23040, 0) == (65536, 8192)
    # a unified pool is n_ctx cells, a conversation at most 4,096 of them
    pool = replace(s, kv_unified=True)
    assert kv_shape(pool, 16, 8192, 23040, 0) == (16384, 4096)


def test_the_kv_cache_takes_at_most_a_quarter_of_the_memory_available() -> None:
    s = EngineSettings(n_parallel=8, n_ctx=16384)
    # 360 MB of KV on a box with 1 GB available: each slot gets fewer cells
    cells, per_seq = kv_shape(s, 8, 8192, 23040, available=1024 * MB)
    assert cells * 23040 <= 256 * MB and per_seq % 256 == 0 and per_seq == 1280
    pool = replace(s, kv_unified=True)
    cells, per_seq = kv_shape(pool, 16, 8192, 23040, available=1024 * MB)
    assert cells * 23040 <= 256 * MB and per_seq <= cells
    # never less than one padded stream a slot
    assert kv_shape(s, 8, 8192, 23040, available=MB)[1] == 256


def test_parked_kv_in_ram_is_sized_from_the_kv_cache_and_the_memory_available() -> None:
    assert park_budget(-1, kv_bytes=360 * MB, available=0) == 45 * MB
    assert park_budget(-1, kv_bytes=360 * MB, available=480 * MB) == 30 * MB
    assert park_budget(64 * MB, kv_bytes=360 * MB, available=800 * MB) == 64 * MB  # as set
    assert park_budget(0, kv_bytes=360 * MB, available=800 * MB) == 0  # parking off


def test_where_the_disk_tier_parks_parked_kv_takes_no_ram_unless_asked() -> None:
    assert park_budget(-1, kv_bytes=360 * MB, available=0, disk=True) == 0
    assert park_budget(-1, kv_bytes=360 * MB, available=800 * MB, disk=True) == 0
    assert park_budget(64 * MB, kv_bytes=360 * MB, available=800 * MB, disk=True) == 64 * MB


async def test_a_loaded_engine_holds_the_kv_cache_its_settings_ask_and_reports_it(
    tiny_gguf: Path,
) -> None:
    settings = EngineSettings(n_parallel=4, n_ctx=2048, n_threads=2, stream_interval_s=0)
    engine = LlamaEngine(tiny_gguf, "tiny", settings)
    try:
        await engine.start()
        assert engine.info.n_ctx_per_seq == 512  # 2,048 cells shared out among 4 slots
        memory = engine.memory()
        assert memory["kv_bytes"] == engine.model.kv_bytes(2048, settings.kv_type)
        assert engine._scheduler is not None
        park = engine._scheduler.slots.park_bytes
        assert 0 < park <= memory["kv_bytes"] // 8
        # free state memory kept for reuse: what parking may hold, or two whole streams'
        # states where that is more (a park being written and a prefix copy)
        stream = engine.model.kv_bytes(512, settings.kv_type)
        assert engine._ctx is not None
        keep = engine._ctx.states.keep_bytes
        assert keep >= max(park, 2 * stream) and keep <= max(park, 2 * stream) * 1.02 + (2 << 20)
        assert memory["state_free_bytes"] <= keep
    finally:
        await engine.stop()
        engine.close()


async def test_with_a_disk_tier_an_engine_parks_no_kv_in_ram(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    settings = EngineSettings(
        n_parallel=4, n_ctx=2048, n_threads=2, stream_interval_s=0, kv_dir=tmp_path / "kv"
    )
    engine = LlamaEngine(tiny_gguf, "tiny", settings)
    try:
        await engine.start()
        assert engine._scheduler is not None and engine._ctx is not None
        assert engine._scheduler.slots.disk is not None
        assert engine._scheduler.slots.park_bytes == 0
        # only the state memory of two saves under way is kept (512 cells a stream)
        keep = engine._ctx.states.keep_bytes
        assert keep < 2 * engine.model.kv_bytes(512, settings.kv_type) * 1.02 + (2 << 20)
    finally:
        await engine.stop()
        engine.close()


def test_the_shipped_kv_cache_is_q8_0_and_keys_and_values_may_differ(tiny_gguf: Path) -> None:
    shipped = EngineSettings()
    assert shipped.kv_type == "q8_0"
    assert attention(shipped, offloaded=False, n_head=9, n_ctx_per_seq=2048).flash_attn
    # quantized keys alone leave plain attention possible (llama.cpp's V layout is f16)
    keys = replace(shipped, kv_type="q8_0/f16", kv_unified=False)
    assert attention(keys, offloaded=False, n_head=9, n_ctx_per_seq=2048).flash_attn is False
    model = Model(tiny_gguf, n_gpu_layers=0)
    try:
        f16, q8 = model.kv_bytes(1024, "f16"), model.kv_bytes(1024, "q8_0")
        assert q8 * 32 == f16 * 17  # 34 bytes a block of 32 values against 64
        assert model.kv_bytes(1024, "q8_0/f16") == (f16 + q8) // 2
        with pytest.raises(LlamaError, match="unknown kv_type"):
            model.kv_bytes(1024, "q8_0/q7")
    finally:
        model.close()


def test_what_start_up_work_taught_is_forgotten_once_it_ends() -> None:
    """Steps measured while start-up work held a core (two threads collapse) moved every
    bucket to one thread; a reset starts again from every core, as the engine does when
    the server turns ready."""
    tuner = ThreadTuner(2, (2, 2))
    used = run_steps(tuner, 200, 8, {1: 0.045, 2: 0.300})
    assert tuner.summary()["<=16"] == 1 and used[-1] == 1
    tuner.reset()
    assert tuner.summary()["<=16"] == 2
    used = run_steps(tuner, 30, 8, {1: 0.040, 2: 0.025})
    assert used.count(2) >= 29  # at full speed from the first step, one lone try
