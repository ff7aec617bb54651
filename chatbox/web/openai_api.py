"""The OpenAI-compatible API: /v1/chat/completions and /v1/models, stateless."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

from litestar import Controller, Response, get, post
from litestar.response import Stream

from chatbox.chat import (
    ChatMessage,
    DoneEvent,
    Generation,
    GenerationFailed,
    InvalidInput,
    TokenEvent,
    TurnOptions,
    Usage,
)
from chatbox.web.deps import ChatDep, SettingsDep, UserDep
from chatbox.web.errors import ERROR_RESPONSES, OPENAI_EXCEPTION_HANDLERS
from chatbox.web.sse import SSE_HEADERS, with_heartbeats

_ROLE_AS: dict[str, Literal["system", "user", "assistant"]] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
}
_ROLES = set(_ROLE_AS)


@dataclass
class ChatCompletionIn:
    messages: list[dict[str, Any]]
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = 1

    def to_messages(self) -> tuple[ChatMessage, ...]:
        out = []
        for i, message in enumerate(self.messages):
            if not isinstance(message, dict):
                raise InvalidInput(f"messages[{i}] must be an object", f"messages[{i}]")
            role = message.get("role")
            if not isinstance(role, str) or role not in _ROLES:
                raise InvalidInput(
                    f"messages[{i}].role must be one of {sorted(_ROLES)}", f"messages[{i}].role"
                )
            out.append(
                ChatMessage(_ROLE_AS[role], _text(message.get("content"), f"messages[{i}].content"))
            )
        if not any(m.content.strip() for m in out if m.role == "user"):
            raise InvalidInput("messages must contain a non-empty user message", "messages")
        return tuple(out)

    def options(self) -> TurnOptions:
        if self.n != 1:
            raise InvalidInput("only n=1 is supported", "n")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return TurnOptions(
            self.model,
            self.temperature,
            self.top_p,
            self.max_completion_tokens or self.max_tokens,
            self.seed,
            stop,
        )


def _text(content: Any, param: str) -> str:
    """A message's content: a string, or a list of text parts (joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if (
                not isinstance(part, dict)
                or part.get("type", "text") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise InvalidInput(
                    f'{param}[{j}] must be a text part ({{"type": "text", "text": "..."}})',
                    f"{param}[{j}]",
                )
            texts.append(part["text"])
        return "".join(texts)
    raise InvalidInput(f"{param} must be a string or a list of text parts", param)


def usage_out(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def _finish(done: DoneEvent | None) -> str:
    return "length" if done is not None and done.finish_reason == "length" else "stop"


class OpenAIController(Controller):
    path = "/v1"
    tags = ["openai"]
    exception_handlers = OPENAI_EXCEPTION_HANDLERS

    @get("/models")
    async def models(self, chat: ChatDep, user: UserDep) -> dict[str, Any]:
        """The models this user may pick, plus "auto" (routing by the request's shape)."""
        return {
            "object": "list",
            "data": [
                {"id": n, "object": "model", "created": 0, "owned_by": "chatbox"}
                for n in [*chat.models.names(), "auto"]
            ],
        }

    @post("/chat/completions", status_code=200, responses=ERROR_RESPONSES)
    async def completions(
        self,
        chat: ChatDep,
        settings: SettingsDep,
        user: UserDep,
        data: ChatCompletionIn,
    ) -> Any:
        model, generation, _ = await chat.complete(data.to_messages(), data.options(), user)
        headers = {**chat.limit_headers(user), "x-chatbox-model": model}
        route = getattr(getattr(generation, "ticket", None), "route", None)
        if route is not None:
            headers["x-chatbox-route"] = route.reason
            if route.degraded_from:
                headers["x-chatbox-degraded-from"] = route.degraded_from
            if route.arm:
                headers["x-chatbox-arm"] = route.arm
        ident = "chatcmpl-" + secrets.token_hex(12)
        created = int(time.time())
        if data.stream:
            include_usage = bool((data.stream_options or {}).get("include_usage"))
            body = _chunks(generation, ident, created, model, include_usage)
            return Stream(
                with_heartbeats(body, settings.heartbeat_s),
                media_type="text/event-stream",
                headers={**SSE_HEADERS, **headers},
            )
        text, done = [], None
        try:
            async for event in generation:
                if isinstance(event, TokenEvent):
                    text.append(event.text)
                elif isinstance(event, DoneEvent):
                    done = event
        finally:
            generation.cancel()  # no-op once finished; frees the slot if the client left
        if done is None or done.finish_reason == "error":
            raise GenerationFailed(done.error if done and done.error else "generation failed")
        return Response(
            {
                "id": ident,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": _finish(done),
                        "message": {"role": "assistant", "content": "".join(text)},
                    }
                ],
                "usage": usage_out(done.usage),
            },
            headers=headers,
        )


async def _chunks(
    generation: Generation, ident: str, created: int, model: str, include_usage: bool
) -> AsyncIterator[bytes]:
    def chunk(delta: dict[str, Any], finish: str | None, **extra: Any) -> bytes:
        body = {
            "id": ident,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **extra,
        }
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n".encode()

    done: DoneEvent | None = None
    try:
        yield chunk({"role": "assistant", "content": ""}, None)
        async for event in generation:
            if isinstance(event, TokenEvent):
                yield chunk({"content": event.text}, None)
            elif isinstance(event, DoneEvent):
                done = event
        if done is not None and done.finish_reason == "error":
            error = {
                "error": {"message": done.error or "generation failed", "type": "server_error"}
            }
            yield f"data: {json.dumps(error)}\n\n".encode()
        else:
            yield chunk({}, _finish(done))
            if include_usage and done is not None:
                body = {
                    "id": ident,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": usage_out(done.usage),
                }
                yield f"data: {json.dumps(body)}\n\n".encode()
        yield b"data: [DONE]\n\n"
    finally:
        generation.cancel()  # a client that disconnects stops its generation
