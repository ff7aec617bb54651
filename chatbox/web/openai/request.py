"""Reading an OpenAI chat completion request: messages (with tool calls and tool results),
and the parameters beyond plain sampling, each checked with OpenAI's ranges."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal

from chatbox.chat import ChatMessage, InvalidInput, TurnOptions
from chatbox.chat.stateless.structured import (
    Constraint,
    ToolMode,
    response_constraint,
    tool_choice_in,
    tool_constraint,
    tools_in,
)
from chatbox.engine.types import ToolCall

MAX_N = 8
MAX_TOP_LOGPROBS = 20
_ROLE_AS: dict[str, Literal["system", "user", "assistant", "tool"]] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}
# OpenAI parameters chatbox does not implement: refused with a 400 naming them, unless the
# value asks for nothing (OpenAI's default). Parameters OpenAI does not know are ignored.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "functions": (None,),
    "function_call": (None,),
    "audio": (None,),
    "prediction": (None,),
    "web_search_options": (None,),
    "reasoning_effort": (None,),
    "verbosity": (None,),
    "store": (None, False),
    "metadata": (None,),
    "modalities": (None, ["text"]),
    "service_tier": (None, "auto", "default"),
}


@dataclass(frozen=True)
class AnswerShape:
    """How the answer is written back: tool calls to read out, logprobs to report."""

    tool_mode: ToolMode = "none"
    logprobs: bool = False
    top_logprobs: int = 0
    n: int = 1


def refuse_unsupported(values: dict[str, Any]) -> None:
    for name, harmless in UNSUPPORTED.items():
        value = values.get(name)
        if value not in harmless:
            raise InvalidInput(f"{name} is not supported by this server", name)


def messages_in(raw: list[Any]) -> tuple[ChatMessage, ...]:
    """The conversation so far; any roles, a system or developer message alone included."""
    return tuple(_message(i, m) for i, m in enumerate(raw))


def _message(i: int, message: Any) -> ChatMessage:
    param = f"messages[{i}]"
    if not isinstance(message, dict):
        raise InvalidInput(f"{param} must be an object", param)
    role = message.get("role")
    if not isinstance(role, str) or role not in _ROLE_AS:
        raise InvalidInput(f"{param}.role must be one of {sorted(_ROLE_AS)}", f"{param}.role")
    calls = _calls(message.get("tool_calls"), f"{param}.tool_calls") if role == "assistant" else ()
    content = message.get("content")
    text = "" if content is None and calls else _text(content, f"{param}.content")
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str):
            raise InvalidInput(f"{param}.tool_call_id is required", f"{param}.tool_call_id")
        name = message.get("name")
        return ChatMessage("tool", text, tool_call_id=call_id, name=_str_or_none(name))
    return ChatMessage(_ROLE_AS[role], text, tool_calls=calls)


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _calls(raw: Any, param: str) -> tuple[ToolCall, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidInput(f"{param} must be an array", param)
    out = []
    for j, call in enumerate(raw):
        fn = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(call, dict)
            or not isinstance(fn, dict)
            or not isinstance(fn.get("name"), str)
            or not isinstance(call.get("id"), str)
        ):
            raise InvalidInput(
                f"{param}[{j}] must have an id and a function with a name and arguments",
                f"{param}[{j}]",
            )
        args = fn.get("arguments", "{}")
        out.append(ToolCall(call["id"], fn["name"], args if isinstance(args, str) else "{}"))
    return tuple(out)


def _text(content: Any, param: str) -> str:
    """A message's content: a string, or a list of text parts (joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type", "text") if isinstance(part, dict) else None
            if kind in ("image_url", "input_image", "input_audio", "file"):
                raise InvalidInput(
                    f"{param}[{j}] is an {kind} part: this server has no model that reads"
                    " images, audio or files; send text only",
                    f"{param}[{j}]",
                )
            if kind != "text" or not isinstance(part.get("text"), str):
                raise InvalidInput(
                    f'{param}[{j}] must be a text part ({{"type": "text", "text": "..."}})',
                    f"{param}[{j}]",
                )
            texts.append(part["text"])
        return "".join(texts)
    raise InvalidInput(f"{param} must be a string or a list of text parts", param)


def _number(value: float | None, name: str, lo: float, hi: float) -> float:
    if value is None:
        return 0.0
    if not math.isfinite(value) or not lo <= value <= hi:
        raise InvalidInput(f"{name} must be between {lo:g} and {hi:g}", name)
    return float(value)


def _bias(raw: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    out = []
    for key, value in (raw or {}).items():
        if not key.isdigit():
            raise InvalidInput(f"logit_bias keys must be token ids; got {key!r}", "logit_bias")
        out.append((int(key), _number(value, "logit_bias", -100, 100)))
    if len(out) > 300:
        raise InvalidInput("logit_bias has more than 300 entries", "logit_bias")
    return tuple(out)


def extend_options(
    base: TurnOptions, values: dict[str, Any], default_max_tokens: int = 512
) -> tuple[TurnOptions, AnswerShape]:
    """The request's structured-output, logprob, penalty and n choices on top of `base`.

    Builds the grammar for tools or response_format: run it off the event loop
    (structured.off_loop)."""
    refuse_unsupported(values)
    for key in ("max_tokens", "max_completion_tokens"):
        if (value := values.get(key)) is not None and value < 1:
            raise InvalidInput(f"{key} must be at least 1", key)
    _number(values.get("temperature"), "temperature", 0, 2)
    _number(values.get("top_p"), "top_p", 0, 1)
    n = 1 if values.get("n") is None else values["n"]
    if not 1 <= n <= MAX_N:
        raise InvalidInput(f"n must be between 1 and {MAX_N}", "n")
    top = values.get("top_logprobs")
    logprobs = bool(values.get("logprobs"))
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise InvalidInput(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}", "top_logprobs")
    if top and not logprobs:
        raise InvalidInput("top_logprobs needs logprobs: true", "top_logprobs")
    user = values.get("user")
    if user is not None and len(user) > 256:
        raise InvalidInput("user must be at most 256 characters", "user")
    budget = base.max_tokens or default_max_tokens  # what schemas are checked against
    tools = tools_in(values.get("tools"), budget)
    mode, name = tool_choice_in(values.get("tool_choice"), tools)
    fmt = response_constraint(values.get("response_format"), budget)
    parallel = values.get("parallel_tool_calls") is not False  # OpenAI's default: true
    calls = tool_constraint(tools, mode, name, budget, parallel)
    if fmt.grammar and calls.grammar:
        if mode == "required":
            raise InvalidInput(
                "response_format cannot be combined with a required tool call", "response_format"
            )
        calls = Constraint()  # auto: the response format wins; the model answers in it
        mode = "none"
    chosen = fmt if fmt.grammar else calls
    options = replace(
        base,
        presence_penalty=_number(values.get("presence_penalty"), "presence_penalty", -2, 2),
        frequency_penalty=_number(values.get("frequency_penalty"), "frequency_penalty", -2, 2),
        logit_bias=_bias(values.get("logit_bias")),
        logprobs=(top or 0) if logprobs else -1,
        grammar=chosen.grammar,
        grammar_triggers=chosen.triggers,
        grammar_param="response_format" if fmt.grammar else "tools",
        tools=tools if mode != "none" else (),
        n=n,
    )
    return options, AnswerShape(mode, logprobs, top or 0, n)
