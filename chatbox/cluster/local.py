"""This front's own engines as one more member of the fleet (the replica named "local").

A front that keeps a local engine for a model some replica also holds puts that engine in
the same rendezvous ring as the replicas: conversation affinity, spill, drain, load and
admission's combined capacity then cover it exactly as they cover a remote replica.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from chatbox.cluster.clients import (
    Health,
    ReplicaBusy,
    ReplicaFailed,
    ReplicaRefused,
    Started,
    StreamEvent,
)
from chatbox.engine.pool import EnginePool
from chatbox.engine.types import (
    ChatMessage,
    ContextOverflowError,
    DoneEvent,
    Engine,
    EngineBusyError,
    EngineError,
    EngineStats,
    GenerationRequest,
    GrammarError,
    ToolSpec,
)

LOCAL = "local"  # the member's name in the ring, the replica list and the CLI


class LocalProvider(Protocol):
    pool: EnginePool

    def names(self) -> list[str]: ...

    def default(self) -> str: ...

    async def engine(self, name: str) -> Engine: ...

    def stats(self, name: str) -> EngineStats | None: ...

    def holds_kv(self, name: str) -> bool: ...

    def default_loaded(self) -> bool: ...


class LocalClient:
    """The front's engines behind the replica client interface (no HTTP in between)."""

    can_continue = True

    def __init__(self, local: LocalProvider) -> None:
        self.local = local
        self._engines: dict[str, Engine] = {}  # those this member has used (loaded)

    def snapshot(self) -> Health:
        """The local models, their context (the settings' bound until one is loaded)."""
        s = self.local.pool.settings
        bound = min(s.n_ctx_per_seq, s.n_ctx)
        models = {}
        for name in self.local.names():
            engine = self._engines.get(name)
            models[name] = engine.info.n_ctx_per_seq if engine is not None else bound
        return Health(models, max(1, s.n_parallel))

    async def health(self) -> Health:
        return self.snapshot()

    async def engine(self, model: str) -> Engine:
        engine = self._engines.get(model)
        if engine is None:
            engine = self._engines[model] = await self.local.engine(model)
        return engine

    def loaded(self, model: str) -> Engine | None:
        return self._engines.get(model)

    async def stream(self, model: str, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        try:
            engine = await self.engine(model)
            gen = engine.submit(request)
        except ContextOverflowError as exc:
            raise ReplicaRefused(str(exc), exc.prompt_tokens, exc.limit) from exc
        except GrammarError as exc:
            raise ReplicaRefused(str(exc)) from exc
        except EngineBusyError as exc:
            raise ReplicaBusy(str(exc)) from exc
        except EngineError as exc:
            raise ReplicaFailed(str(exc)) from exc
        finished = False
        try:
            yield Started(int(getattr(gen, "prompt_tokens", 0)))
            async for event in gen:
                yield event
                if isinstance(event, DoneEvent):
                    finished = True
                    return
        finally:
            if not finished:  # cancelled (the stop button, a closed stream): stop it now
                gen.cancel()
        raise ReplicaFailed("the local answer ended without a done event")

    def count_tokens(
        self, model: str, messages: tuple[ChatMessage, ...], tools: tuple[ToolSpec, ...] = ()
    ) -> int:
        engine = self._engines.get(model)
        if engine is None:
            raise LookupError(f"{model} is not loaded here")
        return engine.count_tokens(messages, tools)

    async def close(self) -> None:
        return None
