"""The engine's narrow public interface: requests in, an async stream of events out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal, Protocol

FinishReason = Literal["stop", "length", "cancelled", "error"]


class EngineError(Exception):
    """A request the engine could not serve; the message is safe to show a user."""


class ContextOverflowError(EngineError):
    """The prompt (plus room to answer) does not fit in one sequence's context."""

    def __init__(self, prompt_tokens: int, limit: int) -> None:
        super().__init__(
            f"the conversation is {prompt_tokens} tokens; this model's limit is {limit} tokens"
        )
        self.prompt_tokens = prompt_tokens
        self.limit = limit


class EngineBusyError(EngineError):
    """The engine's queue is full."""


@dataclass(frozen=True)
class ChatMessage:
    role: Literal["system", "user", "assistant"]
    content: str


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int = 512
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class GenerationRequest:
    """One completion. cache_key (a conversation id) routes it to that conversation's KV.

    The prefix cache is private: KV computed for one `cache_scope` (a user, or a workspace)
    is reused by another scope only for the public part of the prompt, the chat template
    around the first `shared_messages` messages, which the admin configured rather than a
    user typed (a tier's or workspace's system prompt). A request with no scope shares
    nothing but that public part.
    """

    messages: tuple[ChatMessage, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    cache_key: str | None = None
    priority: int = 0  # lower runs first; background work uses > 0
    cache_scope: str | None = None
    shared_messages: int = 0


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


@dataclass(frozen=True)
class TokenEvent:
    text: str


@dataclass(frozen=True)
class DoneEvent:
    finish_reason: FinishReason
    usage: Usage
    error: str | None = None


EngineEvent = TokenEvent | DoneEvent


@dataclass(frozen=True)
class EngineStats:
    """A point-in-time view of one engine's load (for /readyz and admission)."""

    queue_depth: int = 0  # requests waiting for a sequence slot
    running: int = 0  # sequences being prefilled or decoded
    slots_total: int = 0  # sequences that may run at once (n_parallel)
    kv_cells_used: int = 0
    kv_cells_total: int = 0
    cached_prefixes: int = 0  # idle sequences holding a conversation's KV


@dataclass(frozen=True)
class ModelInfo:
    name: str
    path: str
    n_ctx_per_seq: int  # the most tokens one conversation may hold
    n_ctx_train: int
    architecture: str


class Generation(Protocol):
    """A running request: iterate its events; cancel() stops it at the next decode step."""

    def __aiter__(self) -> AsyncIterator[EngineEvent]: ...

    def cancel(self) -> None: ...


class Engine(Protocol):
    """One loaded model."""

    info: ModelInfo

    def count_tokens(self, messages: tuple[ChatMessage, ...]) -> int:
        """Tokens the rendered chat prompt takes (with the generation prompt)."""
        ...

    def submit(self, request: GenerationRequest) -> Generation:
        """Queue a request. Raises ContextOverflowError before queueing if it cannot fit."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...
