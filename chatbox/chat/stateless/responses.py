"""OpenAI's Responses API over the chat completions path: a request's input items,
instructions, tools and text format as a chat completion's messages and parameters; a
chat completion's answer as the response's output items; and the responses kept per user
for `previous_response_id` and `GET /v1/responses/{id}`.

A kept response is content (the `responses` table of the content registry): never written
under zero-data-retention or for `store: false`, erased with the account, past the tier's
retention by the sweeper, and in the user's export.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chatbox.chat.errors import InvalidInput, NotFound
from chatbox.chat.policy import Policy
from chatbox.chat.privacy.temporary import keeps_nothing
from chatbox.engine.types import ChatMessage, ToolCall, Usage
from chatbox.store import Store, User

_ROLES: dict[str, Any] = {
    "user": "user",
    "system": "system",
    "developer": "system",
    "assistant": "assistant",
}
_TEXT_PARTS = ("input_text", "output_text", "text")
_NOT_TEXT = ("input_image", "input_file", "input_audio", "image_url", "file")


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


# -- the request -----------------------------------------------------------------------------


def input_messages(raw: Any) -> list[ChatMessage]:
    """`input`: a string (one user message) or a list of items: messages, `function_call`
    and `function_call_output` items (reasoning items are skipped: no model here makes them)."""
    if isinstance(raw, str):
        return [ChatMessage("user", raw)]
    if not isinstance(raw, list) or not raw:
        raise InvalidInput("input must be a string or a non-empty array of items", "input")
    out: list[ChatMessage] = []
    names: dict[str, str] = {}  # call id: function name, for the outputs that answer them
    for i, item in enumerate(raw):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidInput(f"{param} must be an object", param)
        kind = item.get("type", "message")
        if kind == "message":
            out.append(_message(item, param))
        elif kind == "function_call":
            call = _call(item, param)
            names[call.id] = call.name
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":  # one turn, several calls
                out[-1] = ChatMessage("assistant", last.content, (*last.tool_calls, call))
            else:
                out.append(ChatMessage("assistant", "", (call,)))
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise InvalidInput(f"{param}.call_id is required", f"{param}.call_id")
            text = _content(item.get("output"), f"{param}.output")
            out.append(ChatMessage("tool", text, tool_call_id=call_id, name=names.get(call_id)))
        elif kind == "reasoning":
            continue
        else:
            raise InvalidInput(
                f"{param}.type {kind!r} is not supported by this server: send message,"
                " function_call and function_call_output items",
                f"{param}.type",
            )
    return out


def _message(item: dict[str, Any], param: str) -> ChatMessage:
    role = item.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise InvalidInput(f"{param}.role must be one of {sorted(_ROLES)}", f"{param}.role")
    return ChatMessage(_ROLES[role], _content(item.get("content"), f"{param}.content"))


def _call(item: dict[str, Any], param: str) -> ToolCall:
    call_id, name, args = item.get("call_id"), item.get("name"), item.get("arguments", "{}")
    if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(args, str):
        raise InvalidInput(
            f"{param} must have a call_id, a name and arguments (a JSON string)", param
        )
    return ToolCall(call_id, name, args)


def _content(content: Any, param: str) -> str:
    """A string, or a list of text parts (joined)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidInput(f"{param} must be a string or a list of text parts", param)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _NOT_TEXT:
            raise InvalidInput(
                f"{param}[{j}] is an {kind} part: this server has no model that reads images,"
                " audio or files; send text only",
                f"{param}[{j}]",
            )
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise InvalidInput(
                f'{param}[{j}] must be a text part ({{"type": "input_text", "text": "..."}})',
                f"{param}[{j}]",
            )
        texts.append(part["text"])
    return "".join(texts)


def chat_parameters(body: Mapping[str, Any]) -> dict[str, Any]:
    """The request's tools, tool_choice, text format and sampling as a chat completion's
    parameters (checked by the same code as /v1/chat/completions)."""
    out: dict[str, Any] = {
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_tokens": body.get("max_output_tokens"),
        "parallel_tool_calls": body.get("parallel_tool_calls"),
        "user": body.get("user"),
    }
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise InvalidInput("tools must be an array", "tools")
        out["tools"] = [_tool(i, t) for i, t in enumerate(tools)]
    out["tool_choice"] = _tool_choice(body.get("tool_choice"))
    out["response_format"] = _text_format(body.get("text"))
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") not in (None, "none"):
        raise InvalidInput(
            "reasoning.effort is not supported by this server: its models do not reason",
            "reasoning.effort",
        )
    if body.get("background"):
        raise InvalidInput("background is not supported by this server", "background")
    if body.get("top_logprobs"):
        raise InvalidInput("top_logprobs is not supported on /v1/responses", "top_logprobs")
    return out


def _tool(i: int, tool: Any) -> dict[str, Any]:
    param = f"tools[{i}]"
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind != "function":
        raise InvalidInput(
            f"{param}.type {kind!r} is not supported by this server: only function tools",
            f"{param}.type",
        )
    fn = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
    return {"type": "function", "function": fn}


def _tool_choice(choice: Any) -> Any:
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise InvalidInput(
        'tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...}',
        "tool_choice",
    )


def _text_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise InvalidInput("text.format must be an object", "text.format")
    if fmt.get("type") != "json_schema":
        return fmt
    spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"type": "json_schema", "json_schema": spec}


# Chat completion parameters as the Responses API names them, for the errors' `param`.
_PARAMS = (
    (re.compile(r"^max_tokens\b"), "max_output_tokens"),
    (re.compile(r"^response_format\.json_schema\b"), "text.format"),
    (re.compile(r"^response_format\b"), "text.format"),
    (re.compile(r"^(tools\[\d+\])\.function\b"), r"\1"),
    (re.compile(r"^tool_choice\.function\b"), "tool_choice"),
)


def renamed(exc: InvalidInput) -> InvalidInput:
    """A chat completion's error as the Responses request names its parameter."""
    param = exc.param
    if param is None:
        return exc
    new = param
    for pattern, name in _PARAMS:
        new = pattern.sub(name, new)
    if new == param:
        return exc
    return InvalidInput(str(exc).replace(param, new), new)


# -- the answer -----------------------------------------------------------------------------


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content if status == "completed" else [],
    }


def call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str = "completed"
) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def output_items(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A chat completion's answer message as output items: its text (if any), then its calls."""
    out = []
    calls = message.get("tool_calls") or []
    text = message.get("content") or ""
    if text or not calls:
        out.append(message_item(new_id("msg"), text))
    for c in calls:
        fn = c["function"]
        out.append(call_item(new_id("fc"), c["id"], fn["name"], fn["arguments"]))
    return out


def status_of(finish_reason: str) -> tuple[str, dict[str, str] | None]:
    """The response's status and incomplete_details for a chat finish reason."""
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish_reason == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def usage_of(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


@dataclass(frozen=True)
class Echo:
    """What a response object says back of its request."""

    instructions: str | None
    max_output_tokens: int | None
    parallel_tool_calls: bool
    previous_response_id: str | None
    store: bool
    temperature: float
    top_p: float
    text: dict[str, Any]
    tool_choice: Any
    tools: list[Any]
    user: str | None
    metadata: dict[str, Any]


def echo_of(body: Mapping[str, Any], temperature: float, top_p: float, store: bool) -> Echo:
    text = body.get("text") if isinstance(body.get("text"), dict) else None
    return Echo(
        body.get("instructions"),
        body.get("max_output_tokens"),
        body.get("parallel_tool_calls") is not False,
        body.get("previous_response_id"),
        store,
        temperature,
        top_p,
        {"format": (text or {}).get("format") or {"type": "text"}},
        body.get("tool_choice") or "auto",
        [{"strict": True, **t} for t in body.get("tools") or []],
        body.get("user"),
        dict(body.get("metadata") or {}),
    )


def response_object(
    response_id: str,
    created_at: int,
    model: str,
    echo: Echo,
    status: str = "in_progress",
    output: Sequence[dict[str, Any]] = (),
    usage: Usage | None = None,
    incomplete: dict[str, str] | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The response object, as OpenAI's API writes it."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "error": error,
        "incomplete_details": incomplete,
        "instructions": echo.instructions,
        "max_output_tokens": echo.max_output_tokens,
        "model": model,
        "output": list(output),
        "parallel_tool_calls": echo.parallel_tool_calls,
        "previous_response_id": echo.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": echo.store,
        "temperature": echo.temperature,
        "text": echo.text,
        "tool_choice": echo.tool_choice,
        "tools": echo.tools,
        "top_p": echo.top_p,
        "truncation": "disabled",
        "usage": usage_of(usage) if usage is not None else None,
        "user": echo.user,
        "metadata": echo.metadata,
    }


# -- kept responses --------------------------------------------------------------------------


def _message_out(m: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [[c.id, c.name, c.arguments] for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def _message_in(d: dict[str, Any]) -> ChatMessage:
    calls = tuple(ToolCall(*c) for c in d.get("tool_calls", ()))
    return ChatMessage(d["role"], d["content"], calls, d.get("tool_call_id"), d.get("name"))


def answer_messages(output: Sequence[Mapping[str, Any]]) -> list[ChatMessage]:
    """A response's output items as the assistant message the next request continues from."""
    text, calls = "", []
    for item in output:
        if item.get("type") == "message":
            text += "".join(p.get("text", "") for p in item.get("content", ()))
        elif item.get("type") == "function_call":
            calls.append(ToolCall(item["call_id"], item["name"], item["arguments"]))
    return [ChatMessage("assistant", text, tuple(calls))]


class ResponseLog:
    """The user's kept responses (`store`), under the user's data rules."""

    def __init__(self, store: Store, policy: Policy) -> None:
        self.store = store
        self.policy = policy

    async def keeps(self, user: User, asked: bool) -> bool:
        """Whether this request's response is kept: asked (`store`, true by default) and
        the user's data rules keep content."""
        return asked and not await keeps_nothing(self.store, self.policy, user)

    async def history(self, user: User, previous_id: str) -> list[ChatMessage]:
        """The conversation a `previous_response_id` continues: its input and its answer
        (not its instructions, as OpenAI's API)."""
        if await keeps_nothing(self.store, self.policy, user):
            raise InvalidInput(
                "previous_response_id cannot be used: your account stores no content"
                " (zero-data-retention), so no response is kept; send the whole conversation"
                " as input",
                "previous_response_id",
            )
        row = await self.store.responses.get(previous_id, user.id)
        if row is None:
            raise NotFound(f"Previous response with id '{previous_id}' not found.")
        body = json.loads(row.output)
        return [_message_in(m) for m in json.loads(row.input)] + answer_messages(body["output"])

    async def keep(
        self, user: User, body: Mapping[str, Any], messages: Sequence[ChatMessage]
    ) -> None:
        """Keep a finished response and the messages it answered (instructions aside)."""
        kept = json.dumps([_message_out(m) for m in messages], ensure_ascii=False)
        await self.store.responses.add(
            body["id"], user.id, body["model"], kept, json.dumps(body, ensure_ascii=False)
        )

    async def get(self, user: User, response_id: str) -> dict[str, Any]:
        row = await self.store.responses.get(response_id, user.id)
        if row is None:
            raise NotFound(f"Response with id '{response_id}' not found.")
        body: dict[str, Any] = json.loads(row.output)
        return body

    async def delete(self, user: User, response_id: str) -> None:
        if not await self.store.responses.delete(response_id, user.id):
            raise NotFound(f"Response with id '{response_id}' not found.")
