"""Structured answers for the OpenAI-compatible API: grammars for `tools`/`tool_choice` and
`response_format`, and reading tool calls back out of the generated text as it streams."""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from chatbox.chat.errors import InvalidInput, Overloaded
from chatbox.engine.schema_bounds import SchemaBudget, SchemaTooLarge
from chatbox.engine.tools import (
    CALL_CLOSE,
    CALL_OPEN,
    CALL_TRIGGER,
    DEFAULT_MAX_TOKENS,
    bound_tool_parameters,
    json_object_grammar,
    schema_grammar,
    tool_call_grammar,
)
from chatbox.engine.types import ToolSpec

ToolMode = Literal["none", "auto", "required"]
T = TypeVar("T")
# Grammars are built in these threads, never on the event loop. The schema's bounds keep
# a build under ~0.3 s, so one past the timeout has waited behind others: a 503 to retry.
_BUILDERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="grammar")
BUILD_TIMEOUT_S = 10.0


async def off_loop(build: Callable[[], T]) -> T:
    """Run `build` (request parsing that builds grammars) in the grammar threads; past
    BUILD_TIMEOUT_S the request is answered Overloaded and the build left to finish."""
    future = asyncio.get_running_loop().run_in_executor(_BUILDERS, build)
    try:
        async with asyncio.timeout(BUILD_TIMEOUT_S):
            return await future
    except TimeoutError:
        raise Overloaded(
            "the server is busy building grammars for tools and response formats; retry shortly",
            retry_after=2,
        ) from None


@dataclass(frozen=True)
class Constraint:
    """What the answer must look like: a grammar (lazy when triggers are set)."""

    grammar: str | None = None
    triggers: tuple[str, ...] = ()


def tool_constraint(
    tools: Sequence[ToolSpec],
    mode: ToolMode,
    name: str | None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    parallel: bool = True,
) -> Constraint:
    """`auto` lets the model write text and constrains the calls once it opens one;
    `required` and a named function make the whole answer calls. `parallel`: one or more
    calls, else exactly one."""
    if not tools or mode == "none":
        return Constraint()
    try:
        grammar = tool_call_grammar(tools, name, max_tokens, parallel)
    except SchemaTooLarge as exc:
        raise InvalidInput(str(exc), exc.where or "tools") from exc
    except ValueError as exc:
        raise InvalidInput(f"tools: {exc}", "tools") from exc
    if mode == "auto" and name is None:
        return Constraint(grammar, (CALL_TRIGGER,))
    return Constraint(grammar)


def response_constraint(response_format: Any, max_tokens: int = DEFAULT_MAX_TOKENS) -> Constraint:
    """response_format: text, json_object, or json_schema (strict or not: always enforced);
    a schema whose numbers an answer of `max_tokens` cannot hold is refused, naming them."""
    if response_format is None:
        return Constraint()
    param = "response_format"
    if not isinstance(response_format, dict):
        raise InvalidInput("response_format must be an object", param)
    kind = response_format.get("type")
    if kind == "text":
        return Constraint()
    if kind == "json_object":
        return Constraint(json_object_grammar())
    if kind != "json_schema":
        raise InvalidInput(
            "response_format.type must be one of 'text', 'json_object', 'json_schema'",
            "response_format.type",
        )
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise InvalidInput(
            "response_format.json_schema must be an object with a name", "response_format"
        )
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise InvalidInput(
            "response_format.json_schema.schema must be a JSON schema object",
            "response_format.json_schema.schema",
        )
    try:
        return Constraint(schema_grammar(schema, max_tokens=max_tokens))
    except SchemaTooLarge as exc:
        param = ".".join(p for p in ("response_format.json_schema.schema", exc.where) if p)
        raise InvalidInput(f"{param}: {exc.reason}", param) from exc
    except ValueError as exc:
        raise InvalidInput(str(exc), "response_format.json_schema.schema") from exc


def tools_in(tools: Any, max_tokens: int = DEFAULT_MAX_TOKENS) -> tuple[ToolSpec, ...]:
    """OpenAI `tools` as ToolSpecs (function tools only); parameters whose numbers an
    answer of `max_tokens` cannot hold are refused, naming them."""
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise InvalidInput("tools must be an array", "tools")
    budget = SchemaBudget(max_tokens)  # the call grammar holds them all
    out = []
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise InvalidInput(
                f'{param} must be {{"type": "function", "function": {{...}}}}', param
            )
        name = fn.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
            raise InvalidInput(
                f"{param}.function.name must be 1-64 letters, digits, _ or -",
                f"{param}.function.name",
            )
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise InvalidInput(
                f"{param}.function.parameters must be a JSON schema object",
                f"{param}.function.parameters",
            )
        try:  # before anything recurses into it (json.dumps) or spells it out
            bound_tool_parameters(i, params, budget)
        except SchemaTooLarge as exc:
            raise InvalidInput(str(exc), exc.where) from exc
        description = fn.get("description") or ""
        out.append(ToolSpec(name, str(description), json.dumps(params)))
    if len({t.name for t in out}) != len(out):
        raise InvalidInput("tools must have distinct function names", "tools")
    return tuple(out)


def tool_choice_in(choice: Any, tools: Sequence[ToolSpec]) -> tuple[ToolMode, str | None]:
    """tool_choice: "none" | "auto" | "required" | {"type": "function", "function": {name}}."""
    if choice is None:
        return ("auto" if tools else "none"), None
    if choice in ("none", "auto", "required"):
        if choice != "none" and not tools:
            raise InvalidInput(f"tool_choice {choice!r} needs tools", "tool_choice")
        mode: ToolMode = choice
        return mode, None
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise InvalidInput(
            'tool_choice must be "none", "auto", "required" or'
            ' {"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    if name not in {t.name for t in tools}:
        raise InvalidInput(f"tool_choice names {name!r}, which is not in tools", "tool_choice")
    return "required", name


# -- reading calls back ------------------------------------------------------------------

_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


@dataclass
class Piece:
    """One step of an answer as it streams: text, a call's start, or arguments text."""

    kind: Literal["content", "call", "arguments", "end", "repeat"]
    text: str = ""
    index: int = 0  # which call
    call_id: str = ""
    name: str = ""


@dataclass
class CallReader:
    """Splits generated text into content and tool calls, incrementally (for streaming).

    The arguments stream as they are generated: a small JSON scanner finds where the
    arguments object ends, so nothing is held back but a possible opening tag.
    """

    calls: list[dict[str, Any]] = field(default_factory=list)
    content: str = ""
    repeated: bool = False  # a call came again: the answer is over
    _buf: str = ""
    _state: Literal["text", "head", "args", "after"] = "text"
    _depth: int = 0
    _in_str: bool = False
    _esc: bool = False

    def feed(self, text: str) -> list[Piece]:
        if self.repeated:
            return []
        self._buf += text
        out: list[Piece] = []
        while not self.repeated and self._step(out):
            pass
        return [p for p in out if p.kind != "content" or p.text]

    def finish(self) -> list[Piece]:
        out: list[Piece] = []
        if self._state == "text" and self._buf:
            out.append(self._content(self._buf))
        self._buf = ""
        return [p for p in out if p.text]

    def _content(self, text: str) -> Piece:
        if self.calls:  # text after a call is the model rambling on; keep it out
            return Piece("content", "")
        self.content += text
        return Piece("content", text)

    def _step(self, out: list[Piece]) -> bool:
        buf = self._buf
        if self._state == "text":
            at = buf.find(CALL_OPEN)
            if at < 0:
                keep = _partial_suffix(buf, CALL_OPEN)
                if len(buf) > keep:
                    out.append(self._content(buf[: len(buf) - keep]))
                    self._buf = buf[len(buf) - keep :]
                return False
            if at:
                out.append(self._content(buf[:at]))
            self._buf, self._state = buf[at + len(CALL_OPEN) :], "head"
            return True
        if self._state == "head":
            m = _HEAD.match(buf)
            if m is None:
                return False
            name = json.loads(f'"{m.group(1)}"')
            call_id = "call_" + secrets.token_hex(12)
            self.calls.append({"id": call_id, "name": name, "arguments": ""})
            out.append(Piece("call", index=len(self.calls) - 1, call_id=call_id, name=name))
            self._buf, self._state = buf[m.end() :], "args"
            self._depth, self._in_str, self._esc = 0, False, False
            return True
        if self._state == "args":
            if not self.calls[-1]["arguments"]:  # whitespace after the colon is not arguments
                buf = self._buf = buf.lstrip()
                if not buf:
                    return False
            end = self._scan(buf)
            args = buf if end is None else buf[:end]
            if args:
                self.calls[-1]["arguments"] += args
                out.append(Piece("arguments", args, index=len(self.calls) - 1))
            self._buf = "" if end is None else buf[end:]
            if end is not None:
                self._state = "after"
                out.append(self._ended())
            return end is not None
        at = buf.find(CALL_CLOSE)  # after: skip the closing brace and tag
        if at < 0:
            self._buf = buf[-len(CALL_CLOSE) :]
            return False
        self._buf, self._state = buf[at + len(CALL_CLOSE) :], "text"
        return True

    def _ended(self) -> Piece:
        """The call's arguments are whole: "end", or "repeat" (and the call dropped) when
        it is an earlier call again, which is a small model looping, not a new call."""
        last = self.calls[-1]
        index = len(self.calls) - 1
        if any(_same(c, last) for c in self.calls[:-1]):
            self.calls.pop()
            self.repeated = True
            return Piece("repeat", index=index)
        return Piece("end", index=index)

    def _scan(self, buf: str) -> int | None:
        """Where the arguments value ends in buf (None: not yet), tracking JSON nesting."""
        for i, ch in enumerate(buf):
            if self._in_str:
                if self._esc:
                    self._esc = False
                elif ch == "\\":
                    self._esc = True
                elif ch == '"':
                    self._in_str = False
                    if self._depth == 0:
                        return i + 1
            elif ch == '"':
                self._in_str = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                if self._depth == 0:  # the call object's own closing brace
                    return i
                self._depth -= 1
                if self._depth == 0:
                    return i + 1
            elif self._depth == 0 and ch in ",\n":
                return i
        return None


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a["name"] != b["name"]:
        return False
    try:
        return bool(json.loads(a["arguments"]) == json.loads(b["arguments"]))
    except ValueError:
        return bool(a["arguments"] == b["arguments"])


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
