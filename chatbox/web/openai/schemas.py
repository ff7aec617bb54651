"""The bodies of OpenAI's chat and text completions, as the OpenAPI schema documents them.

The handlers write these bodies as JSON themselves (the answer cache keeps and replays the
very bytes first sent), so these structs describe them; `test_openapi` checks that an
answer's keys are the ones declared here.
"""

from __future__ import annotations

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
