"""The engine end to end on the tiny GGUF: batching, prefix cache, cancellation, pressure."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from chatbox.engine import job as engine_job
from chatbox.engine.engine import LlamaEngine
from chatbox.engine.llama import Context
from chatbox.engine.sampling import Sampler
from chatbox.engine.types import (
    ContextOverflowError,
    DoneEvent,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from tests.engine.conftest import TINY_SETTINGS
from tests.engine.helpers import (
    GREEDY,
    assert_kv_consistent,
    chat,
    collect,
    generate,
    hold_scheduler,
    wait_idle,
)

PROMPTS = [f"Question {i}: tell me about the {w}." for i, w in enumerate("abcdefgh")]
LOGIT_TOL = 2e-2
# both KV layouts: a stream per slot (the default) and one unified pool
LAYOUTS = pytest.mark.parametrize("kv_unified", [False, True], ids=["streams", "pool"])


async def started(tiny_gguf: Path, **overrides: Any) -> LlamaEngine:
    engine = LlamaEngine(tiny_gguf, "tiny", replace(TINY_SETTINGS, **overrides))
    await engine.start()
    return engine


async def test_generates_with_usage(tiny_engine: LlamaEngine) -> None:
    msgs = chat("Hello there")
    r = await generate(tiny_engine, msgs)
    assert r.done.finish_reason == "length"
    assert r.done.usage.completion_tokens == 16
    assert r.done.usage.prompt_tokens == tiny_engine.count_tokens(msgs)
    assert r.text


async def test_logits_in_a_batch_of_8_match_alone(tiny_engine: LlamaEngine) -> None:
    alone = []
    for p in PROMPTS:
        await tiny_engine.clear_cache()
        alone.append(await generate(tiny_engine, chat(p), capture_logits=1))
    await tiny_engine.clear_cache()
    held = await hold_scheduler(tiny_engine, 0.2)
    gens = [
        tiny_engine.submit(GenerationRequest(chat(p), GREEDY), capture_logits=1) for p in PROMPTS
    ]
    batched = await asyncio.gather(*(collect(g) for g in gens))
    await held
    for a, b in zip(alone, batched, strict=True):
        assert np.max(np.abs(a.logits[0] - b.logits[0])) < LOGIT_TOL
        assert int(np.argmax(a.logits[0])) == int(np.argmax(b.logits[0]))  # first greedy token


async def test_second_turn_reuses_the_cached_prefix(tiny_engine: LlamaEngine) -> None:
    first = chat("Tell me a story about a cat.", system="Be brief.")
    r1 = await generate(tiny_engine, first, cache_key="conv-1")
    second = (*first, *chat("Tell me a story about a cat.", r1.text, "And a dog?")[1:])
    warm = await generate(tiny_engine, second, cache_key="conv-1", capture_logits=1)
    assert warm.done.usage.cached_tokens >= r1.done.usage.prompt_tokens - 1
    await tiny_engine.clear_cache()
    cold = await generate(tiny_engine, second, cache_key="conv-1", capture_logits=1)
    assert cold.done.usage.cached_tokens == 0
    assert np.max(np.abs(warm.logits[0] - cold.logits[0])) < LOGIT_TOL
    assert int(np.argmax(warm.logits[0])) == int(np.argmax(cold.logits[0]))


@LAYOUTS
async def test_shared_system_prompt_is_reused_across_conversations(
    tiny_gguf: Path, kv_unified: bool
) -> None:
    engine = await started(tiny_gguf, kv_unified=kv_unified)
    try:
        system = "You are a helpful assistant. " * 20
        a = await generate(engine, chat("first user", system=system), cache_key="a")
        b = await generate(engine, chat("second user", system=system), cache_key="b")
        assert a.done.usage.cached_tokens == 0
        assert b.done.usage.cached_tokens > 100
        await assert_kv_consistent(engine)
        # the copy answers like a cold prefill of the same prompt (within the rounding of
        # f16 KV written in other chunks: a wrong or missing copy is off by whole units)
        warm = await generate(engine, chat("third user", system=system), capture_logits=1)
        assert warm.done.usage.cached_tokens > 100
        await engine.clear_cache()
        cold = await generate(engine, chat("third user", system=system), capture_logits=1)
        assert cold.done.usage.cached_tokens == 0
        assert np.max(np.abs(warm.logits[0] - cold.logits[0])) < 0.1
        assert int(np.argmax(warm.logits[0])) == int(np.argmax(cold.logits[0]))
    finally:
        await engine.stop()


async def test_prefix_copies_between_streams_reuse_state_memory_without_ram_parking(
    tiny_gguf: Path,
) -> None:
    """With no RAM for parked KV (a disk tier's default), the state a prefix is copied
    through is still kept for the next copy: fresh memory would be faulted in on the decode
    thread, a stall of up to 180 ms for a 22 MB state on a virtual machine."""
    engine = await started(tiny_gguf, kv_unified=False, park_bytes=0)
    try:
        system = "You are a helpful assistant. " * 20
        for i in range(3):
            r = await generate(engine, chat(f"user {i}", system=system), cache_key=f"c{i}")
            assert i == 0 or r.done.usage.cached_tokens > 100  # copied from the first stream
        states = await engine.debug_call(lambda s: s.ctx.states)
        assert states.keep_bytes > 0 and states.reused >= 1
        assert (await engine.debug_call(lambda s: s.slots.parked.size)) == 0  # none in RAM
    finally:
        await engine.stop()


async def test_answers_moved_between_kv_streams_keep_their_kv(tiny_engine: LlamaEngine) -> None:
    """With a stream per slot, short answers that end first leave holes among the busy
    sequence ids; the engine moves running answers to close them. A moved conversation's
    KV is intact: its next turn reuses it and sees the logits a cold prefill gives."""
    await tiny_engine.clear_cache()
    before = await tiny_engine.debug_call(lambda s: s.slots.moves)
    lengths = [4, 30, 6, 30]  # the 4- and 6-token answers end first
    held = await hold_scheduler(tiny_engine, 0.2)
    gens = [
        tiny_engine.submit(
            GenerationRequest(
                chat(PROMPTS[i]),
                replace(GREEDY, max_tokens=n),
                cache_key=f"m{i}",
                cache_scope="tester",
            )
        )
        for i, n in enumerate(lengths)
    ]
    results = await asyncio.gather(*(collect(g) for g in gens))
    await held
    assert all(r.done.finish_reason == "length" for r in results)
    assert await tiny_engine.debug_call(lambda s: s.slots.moves) > before
    await assert_kv_consistent(tiny_engine)
    follow_ups = {
        i: (*chat(PROMPTS[i]), *chat("x", results[i].text, "and then?")[1:]) for i in (1, 3)
    }
    warm = {
        i: await generate(tiny_engine, msgs, cache_key=f"m{i}", capture_logits=1)
        for i, msgs in follow_ups.items()
    }
    for i, msgs in follow_ups.items():
        assert warm[i].done.usage.cached_tokens >= results[i].done.usage.prompt_tokens
        await tiny_engine.clear_cache()
        cold = await generate(tiny_engine, msgs, capture_logits=1)
        assert cold.done.usage.cached_tokens == 0
        assert np.max(np.abs(warm[i].logits[0] - cold.logits[0])) < LOGIT_TOL


async def test_cancel_stops_and_frees_cells(tiny_engine: LlamaEngine) -> None:
    await tiny_engine.clear_cache()
    gen = tiny_engine.submit(
        GenerationRequest(chat("go on forever"), replace(GREEDY, max_tokens=900))
    )
    seen = 0
    done: DoneEvent | None = None
    async for ev in gen:
        if isinstance(ev, TokenEvent):
            seen += 1
            if seen == 3:
                gen.cancel()
        else:
            done = ev
    assert done is not None and done.finish_reason == "cancelled"
    assert done.usage.completion_tokens < 900
    await wait_idle(tiny_engine)
    assert tiny_engine.stats().kv_cells_used == 0
    await assert_kv_consistent(tiny_engine)


async def test_abandoned_iteration_cancels(tiny_engine: LlamaEngine) -> None:
    await tiny_engine.clear_cache()
    gen = tiny_engine.submit(
        GenerationRequest(chat("go on forever"), replace(GREEDY, max_tokens=900))
    )
    it = gen.__aiter__()
    await it.__anext__()
    await it.aclose()  # type: ignore[attr-defined]
    await wait_idle(tiny_engine)
    assert tiny_engine.stats().kv_cells_used == 0


async def test_cancel_while_queued(tiny_engine: LlamaEngine) -> None:
    held = await hold_scheduler(tiny_engine, 0.1)
    gen = tiny_engine.submit(GenerationRequest(chat("never mind"), GREEDY))
    gen.cancel()
    await held
    r = await collect(gen)
    assert r.done.finish_reason == "cancelled" and r.text == ""


async def test_a_call_given_up_before_it_runs_leaves_the_decode_thread_running(
    tiny_engine: LlamaEngine,
) -> None:
    held = await hold_scheduler(tiny_engine, 0.2)
    ran: list[bool] = []
    abandoned = asyncio.ensure_future(tiny_engine.debug_call(lambda _s: ran.append(True)))
    await asyncio.sleep(0.01)
    abandoned.cancel()  # what a caller's timeout or an erasure's cancellation does
    await held
    r = await asyncio.wait_for(generate(tiny_engine, chat("still there?")), 60)
    assert r.done.finish_reason == "length" and r.text
    assert not ran


async def test_stop_string_across_token_boundaries(tiny_engine: LlamaEngine) -> None:
    msgs = chat("Say something")
    await tiny_engine.clear_cache()
    full = await generate(tiny_engine, msgs, replace(GREEDY, max_tokens=40))
    assert len(full.text) > 12
    stop = full.text[6:12]
    await tiny_engine.clear_cache()
    cut = await generate(tiny_engine, msgs, replace(GREEDY, max_tokens=40, stop=(stop,)))
    assert cut.done.finish_reason == "stop"
    assert cut.text == full.text[: full.text.index(stop)]


async def test_events_are_whole_utf8(
    tiny_engine: LlamaEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The random tiny model emits stray bytes (rightly shown as U+FFFD), so script its output:
    # the scheduler samples as usual, then emits these tokens -- one per byte of each
    # multi-byte character -- through the real detokenizer.
    text = "😀 日本語 ünïcödé"
    script = tiny_engine.model.tokenize(text, parse_special=False)
    pieces = [tiny_engine.model.piece(t) for t in script]
    assert b"".join(pieces).decode("utf-8") == text
    split = [p for p in pieces if not _is_utf8(p)]
    assert split, "every character fits in one token: the test would prove nothing"

    class ScriptedSampler(Sampler):
        def __init__(self, params: SamplingParams, n_vocab: int, vocab: object = None) -> None:
            super().__init__(params, n_vocab, vocab)
            self.script = iter(script)

        def sample(self, ctx: Context, index: int) -> int:
            super().sample(ctx, index)
            return next(self.script)

    # job.start_sampling builds every request's sampler on the decode thread
    monkeypatch.setattr(engine_job, "Sampler", ScriptedSampler)
    r = await generate(tiny_engine, chat("hi"), replace(GREEDY, max_tokens=len(script)))
    assert r.done.finish_reason == "length"
    assert not [c for c in r.chunks if "\ufffd" in c]  # no character was cut across events
    assert r.text == text


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


async def test_seed_reproduces_sampled_text(tiny_engine: LlamaEngine) -> None:
    params = SamplingParams(temperature=0.9, seed=42, max_tokens=24)
    await tiny_engine.clear_cache()
    a = await generate(tiny_engine, chat("random please"), params)
    await tiny_engine.clear_cache()
    b = await generate(tiny_engine, chat("random please"), params)
    assert a.text == b.text


async def test_all_samplers_run(tiny_engine: LlamaEngine) -> None:
    params = SamplingParams(
        temperature=0.8,
        top_k=20,
        top_p=0.9,
        min_p=0.02,
        repeat_penalty=1.2,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        seed=1,
        max_tokens=20,
    )
    r = await generate(tiny_engine, chat("hi"), params)
    assert r.done.finish_reason == "length" and r.done.usage.completion_tokens == 20


async def test_context_overflow_is_raised_before_queueing(tiny_engine: LlamaEngine) -> None:
    with pytest.raises(ContextOverflowError) as err:
        tiny_engine.submit(GenerationRequest(chat("x" * 5000), GREEDY))
    assert err.value.limit == tiny_engine.info.n_ctx_per_seq
    assert tiny_engine.stats().queue_depth == 0


async def test_generation_stops_at_the_sequence_limit(tiny_gguf: Path) -> None:
    engine = LlamaEngine(tiny_gguf, "tiny", replace(TINY_SETTINGS, n_ctx_per_seq=64))
    await engine.start()
    try:
        r = await generate(engine, chat("hi"), replace(GREEDY, max_tokens=500))
        assert r.done.finish_reason == "length"
        assert r.done.usage.prompt_tokens + r.done.usage.completion_tokens <= 64
    finally:
        await engine.stop()


@LAYOUTS
async def test_eviction_under_kv_pressure(tiny_gguf: Path, kv_unified: bool) -> None:
    small = {"n_ctx": 512, "n_ctx_per_seq": 512, "n_batch": 128}
    engine = await started(tiny_gguf, n_parallel=2, n_cached_seqs=6, kv_unified=kv_unified, **small)
    try:
        convs = [chat(f"{i} " + "lorem ipsum dolor " * 8) for i in range(8)]
        results = await asyncio.gather(
            *(generate(engine, m, cache_key=f"c{i}") for i, m in enumerate(convs))
        )
        assert all(r.done.finish_reason == "length" for r in results)
        st = engine.stats()
        assert st.kv_cells_used <= st.kv_cells_total
        await assert_kv_consistent(engine)
        # conversation 0 was evicted (parked in RAM); its next turn still reuses its prefix
        again = (*convs[0], *chat("x", results[0].text, "next")[1:])
        r = await generate(engine, again, cache_key="c0")
        assert r.done.usage.cached_tokens >= results[0].done.usage.prompt_tokens - 1
        await assert_kv_consistent(engine)
    finally:
        await engine.stop()


@LAYOUTS
async def test_random_workload_leaves_no_leak(tiny_gguf: Path, kv_unified: bool) -> None:
    small = {"n_ctx": 1024, "n_batch": 64}
    engine = await started(tiny_gguf, n_parallel=4, n_cached_seqs=4, kv_unified=kv_unified, **small)
    rnd = random.Random(1234)
    reasons: dict[str, int] = {}

    async def client(i: int) -> None:
        await asyncio.sleep(rnd.random() * 0.5)
        msgs = chat(" ".join(rnd.choice(["alpha", "beta", "日本", "😀"]) for _ in range(20)))
        params = replace(GREEDY, max_tokens=rnd.randrange(1, 40), stop=("zz",))
        req = GenerationRequest(
            msgs, params, cache_key=f"k{rnd.randrange(6)}", cache_scope="tester"
        )
        gen = engine.submit(req)
        mode = rnd.random()
        if mode < 0.2:
            gen.cancel()
        n = 0
        async for ev in gen:
            if isinstance(ev, DoneEvent):
                reasons[ev.finish_reason] = reasons.get(ev.finish_reason, 0) + 1
                break
            ev.text.encode("utf-8")
            n += 1
            if mode > 0.8 and n >= 2:
                if mode > 0.9:
                    gen.cancel()
                else:
                    break  # abandon the stream

    try:
        await asyncio.gather(*(client(i) for i in range(250)))
        await wait_idle(engine)
        assert "error" not in reasons
        assert reasons.get("cancelled", 0) > 0 and reasons.get("length", 0) > 0
        st = engine.stats()
        assert st.running == 0 and st.queue_depth == 0
        await assert_kv_consistent(engine)
        await engine.clear_cache()
        assert engine.stats().kv_cells_used == 0
        report = await engine.kv_report()
        assert all(v == (0, 0) for v in report.values())
        busy = await engine.debug_call(lambda s: [x.seq for x in s.slots.slots if x.busy])
        assert busy == []
    finally:
        await engine.stop()


async def test_metrics_in_the_given_registry(tiny_gguf: Path) -> None:
    registry = CollectorRegistry()
    engine = LlamaEngine(tiny_gguf, "tiny", TINY_SETTINGS, registry=registry)
    await engine.start()
    try:
        await generate(engine, chat("hello"), replace(GREEDY, max_tokens=4))
        text = generate_latest(registry).decode()
        assert 'chatbox_engine_requests_total{finish_reason="length",model="tiny"} 1.0' in text
        assert 'chatbox_engine_generated_tokens_total{model="tiny"} 4.0' in text
        assert "chatbox_engine_time_to_first_token_seconds_bucket" in text
        assert 'chatbox_engine_kv_cells_total{model="tiny"} 8192.0' in text  # 8 streams of 1,024
    finally:
        await engine.stop()


async def test_one_failing_request_does_not_take_others_down(tiny_engine: LlamaEngine) -> None:
    long = replace(GREEDY, max_tokens=400)

    def sabotage(bad_req: GenerationRequest) -> Callable[[Any], bool]:
        def apply(s: Any) -> bool:
            for job in s.active:
                if job.request is bad_req:
                    job.stream = None  # the next sampling step of this job raises
                    return True
            return False  # it had finished: the tiny model is that fast on a quiet core

        return apply

    for _ in range(3):
        bad_req = GenerationRequest(chat("this one breaks"), long)
        bad = tiny_engine.submit(bad_req)
        good = tiny_engine.submit(GenerationRequest(chat("this one is fine"), long))
        bad_it, good_it = bad.__aiter__(), good.__aiter__()
        await bad_it.__anext__()
        await good_it.__anext__()
        broken = await tiny_engine.debug_call(sabotage(bad_req))
        bad_events = [ev async for ev in bad_it]
        good_events = [ev async for ev in good_it]
        if broken:
            break
    assert broken, "both answers ended before the sabotage reached the engine, three times"
    assert isinstance(bad_events[-1], DoneEvent) and bad_events[-1].finish_reason == "error"
    assert isinstance(good_events[-1], DoneEvent) and good_events[-1].finish_reason == "length"
    await wait_idle(tiny_engine)
    await assert_kv_consistent(tiny_engine)


@pytest.mark.parametrize("kv_type,flash_attn", [("q8_0", False), ("f16", True)])
async def test_kv_type_and_flash_attention(tiny_gguf: Path, kv_type: str, flash_attn: bool) -> None:
    settings = replace(TINY_SETTINGS, kv_type=kv_type, flash_attn=flash_attn, n_ctx=1024)
    engine = LlamaEngine(tiny_gguf, "tiny", settings)
    await engine.start()
    try:
        first = chat("hello there")
        r1 = await generate(engine, first, cache_key="k")
        r2 = await generate(engine, (*first, *chat("x", r1.text, "again")[1:]), cache_key="k")
        assert r1.done.finish_reason == r2.done.finish_reason == "length"
        assert r2.done.usage.cached_tokens > 0
        await assert_kv_consistent(engine)
    finally:
        await engine.stop()
