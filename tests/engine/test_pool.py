"""EnginePool: lazy loading by name, one engine per model, stats, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from chatbox.engine import create_engine
from chatbox.engine.pool import EnginePool
from chatbox.engine.types import DoneEvent, GenerationRequest, SamplingParams
from tests.engine.conftest import TINY_SETTINGS
from tests.engine.helpers import chat


async def test_pool_loads_once_and_stops_all(tiny_gguf: Path) -> None:
    calls: list[str] = []

    def resolve(name: str) -> Path:
        calls.append(name)
        return tiny_gguf

    registry = CollectorRegistry()
    pool = EnginePool(resolve, TINY_SETTINGS, registry)
    a, b = await asyncio.gather(pool.get("tiny"), pool.get("tiny"))
    assert a is b and calls == ["tiny"]
    assert pool.loaded() == ["tiny"]
    gen = a.submit(GenerationRequest(chat("hi"), SamplingParams(temperature=0, max_tokens=3)))
    events = [ev async for ev in gen]
    assert isinstance(events[-1], DoneEvent)
    stats = pool.stats()["tiny"]
    assert stats.slots_total == TINY_SETTINGS.n_parallel and stats.running == 0
    assert 'model="tiny"' in generate_latest(registry).decode()
    await pool.stop_all()
    assert pool.loaded() == []


async def test_two_models_share_one_registry(tiny_gguf: Path) -> None:
    registry = CollectorRegistry()
    pool = EnginePool(lambda _name: tiny_gguf, TINY_SETTINGS, registry)
    await pool.get("one")
    await pool.get("two")
    text = generate_latest(registry).decode()
    assert 'model="one"' in text and 'model="two"' in text
    await pool.stop_all()


async def test_create_engine_factory(tiny_gguf: Path) -> None:
    engine = create_engine(tiny_gguf, "tiny", TINY_SETTINGS)
    assert engine.info.name == "tiny" and engine.info.architecture == "llama"
    assert engine.info.n_ctx_per_seq == TINY_SETTINGS.n_ctx_per_seq
    assert engine.count_tokens(chat("hello")) > 3
    await engine.start()
    await engine.stop()


async def test_a_loading_model_says_so_and_counts_who_waits(tiny_gguf: Path) -> None:
    gate = asyncio.Event()

    def slow_resolve(name: str) -> Path:
        if name == "broken":
            raise FileNotFoundError("no such file: broken.gguf")
        asyncio.run_coroutine_threadsafe(gate.wait(), loop).result(timeout=30)
        return tiny_gguf

    loop = asyncio.get_running_loop()
    pool = EnginePool(slow_resolve, TINY_SETTINGS, CollectorRegistry())
    assert pool.state("tiny") == "not loaded"
    first = asyncio.create_task(pool.get("tiny"))
    second = asyncio.create_task(pool.get("tiny"))
    await asyncio.sleep(0.05)
    assert pool.state("tiny") == "loading" and pool.waiting("tiny") == 2
    gate.set()
    assert await first is await second
    assert pool.state("tiny") == "loaded" and pool.waiting("tiny") == 0
    with contextlib.suppress(FileNotFoundError):
        await pool.get("broken")
    assert pool.state("broken") == "failed: no such file: broken.gguf"
    await pool.stop_all()
