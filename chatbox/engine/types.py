"""The engine's narrow public interface: requests in, an async stream of events out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal, Protocol

# "content_filter" is set by the chat layer (output moderation cut it), never by the engine.
FinishReason = Literal["stop", "length", "cancelled", "error", "content_filter"]


class EngineError(Exception):
    """A request the engine could not serve; the message is safe to show a user."""


def answer_room(max_tokens: int) -> int:
    """Tokens a prompt must leave free in its sequence to be accepted at all."""
    return min(max(max_tokens, 1), 16)


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


class GrammarError(EngineError):
    """A request's grammar that llama.cpp cannot compile (the caller's mistake)."""


@dataclass(frozen=True)
class ToolCall:
    """A function call the assistant made; `arguments` is its JSON text."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolSpec:
    """A function the model may call; `parameters` is its JSON schema as text."""

    name: str
    description: str = ""
    parameters: str = '{"type": "object", "properties": {}}'


@dataclass(frozen=True)
class ChatMessage:
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant's calls
    tool_call_id: str | None = None  # a tool message: the call it answers
    name: str | None = None  # a tool message: the function's name


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
    grammar: str | None = None  # GBNF the answer must match (root rule "root")
    grammar_triggers: tuple[str, ...] = ()  # lazy: the grammar applies from a match onward
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias); -100 bans a token
    logprobs: int = -1  # -1: none; k >= 0: each token's logprob and the top k alternatives


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
    persist: bool = True  # False (zero data retention): its KV is never parked, and goes at its end
    tools: tuple[ToolSpec, ...] = ()  # rendered by the chat template (or a fallback)
    n: int = 1  # answers to the same prompt; they share its prefill (KV sequence copy)
    # A partial answer to continue as the same assistant message (failover in router mode).
    continue_text: str = ""
    # A raw prompt (/v1/completions): tokenized as it is, no chat template; `messages` then
    # holds it as one user message, for moderation and estimates.
    prompt: str | None = None
    # False: work no user waits on (shadow traffic), left out of the latency and request
    # metrics that alerts and the console read.
    metered: bool = True


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


@dataclass(frozen=True)
class TokenLogprob:
    """One sampled token's log-probability under the model, and the top alternatives."""

    piece: bytes
    logprob: float
    top: tuple[tuple[bytes, float], ...] = ()  # most likely first


@dataclass(frozen=True)
class TokenEvent:
    text: str
    index: int = 0  # which of the request's n answers
    logprobs: tuple[TokenLogprob, ...] = ()  # the tokens this text came from (when asked)
    # Events joined into this one on their way (a consumer behind), one per token, in order:
    # the OpenAI API still writes a chunk per token. Empty: this event is one token's.
    parts: tuple[TokenEvent, ...] = ()


@dataclass(frozen=True)
class DoneEvent:
    """The request ended. With n > 1 it comes once, after every answer ended:
    `finish_reasons` has one reason per answer and usage counts all their tokens."""

    finish_reason: FinishReason
    usage: Usage
    error: str | None = None
    finish_reasons: tuple[FinishReason, ...] = ()
    index: int = 0  # inside the engine: which answer ended
    timings: Timings | None = None  # where the request's time went (for traces)


@dataclass(frozen=True)
class Timings:
    """Seconds a request spent waiting for a slot, prefilling (to its first token), decoding."""

    queued_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0


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

    def count_tokens(
        self, messages: tuple[ChatMessage, ...], tools: tuple[ToolSpec, ...] = ()
    ) -> int:
        """Tokens the rendered chat prompt takes (with the generation prompt and the tools'
        descriptions)."""
        ...

    def submit(self, request: GenerationRequest) -> Generation:
        """Queue a request. Raises ContextOverflowError before queueing if it cannot fit."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...
