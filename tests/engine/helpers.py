"""Small helpers shared by the engine tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from chatbox.engine.engine import LlamaEngine
from chatbox.engine.generation import EngineGeneration
from chatbox.engine.types import (
    ChatMessage,
    DoneEvent,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from chatbox.settings import EngineSettings

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


@dataclass
class Result:
    text: str
    done: DoneEvent
    chunks: list[str] = field(default_factory=list)
    logits: list[np.ndarray] = field(default_factory=list)


@asynccontextmanager
async def running(path: Path, settings: EngineSettings) -> AsyncIterator[LlamaEngine]:
    """An engine on the model at path, started, and stopped and closed afterwards."""
    engine = LlamaEngine(path, "tiny", settings)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()
        engine.close()


def chat(*turns: str, system: str | None = None) -> tuple[ChatMessage, ...]:
    msgs = [ChatMessage("system", system)] if system else []
    for i, text in enumerate(turns):
        msgs.append(ChatMessage("user" if i % 2 == 0 else "assistant", text))
    return tuple(msgs)


async def collect(gen: EngineGeneration) -> Result:
    chunks: list[str] = []
    done: DoneEvent | None = None
    async for ev in gen:
        if isinstance(ev, TokenEvent):
            chunks.append(ev.text)
        else:
            done = ev
    assert done is not None
    return Result("".join(chunks), done, chunks, list(gen.first_logits))


async def generate(
    engine: LlamaEngine,
    messages: tuple[ChatMessage, ...],
    sampling: SamplingParams = GREEDY,
    cache_key: str | None = None,
    capture_logits: int = 0,
    cache_scope: str | None = "tester",  # one user's requests, unless a test says otherwise
) -> Result:
    req = GenerationRequest(messages, sampling, cache_key=cache_key, cache_scope=cache_scope)
    return await collect(engine.submit(req, capture_logits=capture_logits))


async def hold_scheduler(engine: LlamaEngine, seconds: float) -> asyncio.Future[object]:
    """Block the decode thread briefly so that requests submitted now share one batch."""
    import time

    fut = asyncio.ensure_future(engine.debug_call(lambda _s: time.sleep(seconds)))
    await asyncio.sleep(0.01)
    return fut


async def wait_idle(engine: LlamaEngine, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        st = engine.stats()
        if st.running == 0 and st.queue_depth == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"engine not idle: {engine.stats()}")


async def assert_kv_consistent(engine: LlamaEngine) -> None:
    report = await engine.kv_report()
    for seq, (table, llama) in report.items():
        assert table == llama, f"seq {seq}: slot table says {table} tokens, llama.cpp {llama}"


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max())
    return e / e.sum()
