"""Small stand-ins for the chat layer's collaborators: an engine, a model provider, usage."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from chatbox.engine.types import (
    ChatMessage,
    ContextOverflowError,
    DoneEvent,
    EngineBusyError,
    EngineEvent,
    EngineStats,
    GenerationRequest,
    ModelInfo,
    TokenEvent,
    ToolSpec,
    Usage,
)


class FakeGeneration:
    """Events are pushed by the test; cancel() ends the stream with a cancelled Done."""

    def __init__(self, cancel_usage: Usage | None = None) -> None:
        self.events: asyncio.Queue[EngineEvent] = asyncio.Queue()
        self.cancelled = False
        self.cancel_usage = cancel_usage or Usage()
        self._finished = False

    def push(self, *texts: str, done: Usage | None = None) -> None:
        for text in texts:
            self.events.put_nowait(TokenEvent(text))
        if done is not None:
            self.events.put_nowait(DoneEvent("stop", done))

    def __aiter__(self) -> AsyncIterator[EngineEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[EngineEvent]:
        while not self._finished:
            event = await self.events.get()
            if isinstance(event, DoneEvent):
                self._finished = True
            yield event

    def cancel(self) -> None:
        if not self.cancelled and not self._finished:
            self.cancelled = True
            self.events.put_nowait(DoneEvent("cancelled", self.cancel_usage))


@dataclass
class FakeEngine:
    """count_tokens is one token per character; submit records the request."""

    name: str = "tiny"
    limit: int = 100
    busy: bool = False
    overflow: bool = False
    submitted: list[GenerationRequest] = field(default_factory=list)
    generations: list[FakeGeneration] = field(default_factory=list)

    @property
    def info(self) -> ModelInfo:
        return ModelInfo(self.name, f"/models/{self.name}.gguf", self.limit, 2048, "llama")

    def count_tokens(
        self, messages: tuple[ChatMessage, ...], tools: tuple[ToolSpec, ...] = ()
    ) -> int:
        return sum(len(m.content) for m in messages) + sum(len(t.description) for t in tools)

    def submit(self, request: GenerationRequest) -> FakeGeneration:
        if self.busy:
            raise EngineBusyError("the queue is full")
        if self.overflow:
            raise ContextOverflowError(self.limit + 1, self.limit)
        self.submitted.append(request)
        generation = FakeGeneration()
        self.generations.append(generation)
        return generation

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass
class FakeModels:
    """A ModelProvider over fake engines, one per installed name."""

    engines: dict[str, FakeEngine]
    default_name: str = "tiny"
    load_error: Exception | None = None

    def names(self) -> list[str]:
        return list(self.engines)

    def default(self) -> str:
        return self.default_name

    async def engine(self, name: str) -> FakeEngine:
        if self.load_error is not None:
            raise self.load_error
        return self.engines[name]

    def stats(self, name: str) -> EngineStats | None:
        return None

    def holds_kv(self, name: str) -> bool:
        return name in self.engines


@dataclass
class FakeUsage:
    """What the Gatekeeper records, in memory (the UsageRepo's methods it calls)."""

    records: list[dict[str, Any]] = field(default_factory=list)

    async def record(self, user_id: str, model: str, **counts: Any) -> None:
        self.records.append({"user_id": user_id, "model": model, **counts})

    def record_soon(self, user_id: str, model: str, **counts: Any) -> None:
        self.records.append({"user_id": user_id, "model": model, **counts})

    async def tokens_since(self, user_id: str, day: str) -> int:
        return 0
