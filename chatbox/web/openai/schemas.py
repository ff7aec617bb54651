"""The bodies of OpenAI's chat and text completions, as the OpenAPI schema documents them.

The handlers write these bodies as JSON themselves (the answer cache keeps and replays the
very bytes first sent), so these structs describe them; `test_openapi` checks that an
answer's keys are the ones declared here.
"""

from __future__ import annotations

from typing import Any

from msgspec import Struct


class CachedTokens(Struct):
    cached_tokens: int


class UsageOut(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: CachedTokens


class TopLogprob(Struct):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprobOut(TopLogprob):
    top_logprobs: list[TopLogprob]


class LogprobsOut(Struct):
    content: list[TokenLogprobOut]


class FunctionCall(Struct):
    name: str
    arguments: str  # JSON text


class ToolCallOut(Struct):
    id: str
    type: str  # "function"
    function: FunctionCall


class AnswerMessageOut(Struct, omit_defaults=True):
    role: str
    content: str | None
    tool_calls: list[ToolCallOut] | None = None  # only when the model called tools


class ChatChoiceOut(Struct):
    index: int
    finish_reason: str  # stop, length, tool_calls or content_filter
    message: AnswerMessageOut
    logprobs: LogprobsOut | None


class ChatCompletionOut(Struct):
    """`/v1/chat/completions` without `stream` (with it: `chat.completion.chunk` events)."""

    id: str
    object: str  # "chat.completion"
    created: int
    model: str
    system_fingerprint: str
    choices: list[ChatChoiceOut]
    usage: UsageOut


class TextLogprobsOut(Struct):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class TextChoiceOut(Struct):
    text: str
    index: int
    logprobs: TextLogprobsOut | None
    finish_reason: str


class TextCompletionOut(Struct):
    """`/v1/completions` without `stream` (with it: `text_completion` events)."""

    id: str
    object: str  # "text_completion"
    created: int
    model: str
    system_fingerprint: str
    choices: list[TextChoiceOut]
    usage: UsageOut


class OutputTextOut(Struct):
    type: str  # "output_text"
    text: str
    annotations: list[dict[str, Any]]
    logprobs: list[dict[str, Any]]


class OutputItemOut(Struct, omit_defaults=True):
    """An output item: a `message` (role, content) or a `function_call` (call_id, name,
    arguments)."""

    id: str
    type: str  # "message" or "function_call"
    status: str
    role: str | None = None
    content: list[OutputTextOut] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None  # JSON text


class InputDetailsOut(Struct):
    cached_tokens: int


class OutputDetailsOut(Struct):
    reasoning_tokens: int


class ResponseUsageOut(Struct):
    input_tokens: int
    input_tokens_details: InputDetailsOut
    output_tokens: int
    output_tokens_details: OutputDetailsOut
    total_tokens: int


class ResponseOut(Struct):
    """`/v1/responses` without `stream` (with it: `response.*` events), and a kept response."""

    id: str
    object: str  # "response"
    created_at: int
    status: str  # completed, incomplete or failed
    background: bool
    error: dict[str, Any] | None
    incomplete_details: dict[str, str] | None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputItemOut]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: dict[str, Any]
    store: bool
    temperature: float
    text: dict[str, Any]
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    top_p: float
    truncation: str
    usage: ResponseUsageOut | None
    user: str | None
    metadata: dict[str, Any]


class ResponseDeletedOut(Struct):
    id: str
    object: str  # "response"
    deleted: bool
