"""The built-in tools: the library, memory, the date and time, a calculator, and Python run
in the code sandbox (offered only where the tier's policy enables it).

The knowledge layer's searches come in as callables (`services` wires them), so this module
knows nothing of embeddings or SQL. In a workspace conversation the library is the
workspace's and no member's memory is offered (the rule `chatbox.knowledge.retrieval` keeps
for context too).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from chatbox.chat.tools.base import Citation, Tool, ToolContext, ToolResult, ToolSpec
from chatbox.chat.tools.calculator import CalculatorError, calculate
from chatbox.chat.tools.sandbox import Sandbox


@dataclass(frozen=True)
class Passage:
    """A library passage a search found."""

    document_id: str
    document_name: str
    page: int | None
    text: str
    score: float


# (user id, conversation id, query, workspace id, k) -> passages, best first
SearchLibrary = Callable[[str, str | None, str, str | None, int], Awaitable[list[Passage]]]
Recall = Callable[[str, str, int], Awaitable[list[str]]]  # (user id, query, k) -> facts
Save = Callable[[str, str, str | None], Awaitable[str]]  # (user, fact, conv) -> what was kept
CodeEnabled = Callable[[str], bool]  # tier name -> whether its users get the code interpreter

SNIPPET_CHARS = 240


def _text_arg(arguments: dict[str, Any], name: str, limit: int = 2000) -> str | ToolResult:
    value = arguments.get(name)
    if not isinstance(value, str) or not value.strip():
        return ToolResult(f"the argument {name!r} must be a non-empty string", is_error=True)
    if len(value) > limit:
        return ToolResult(f"the argument {name!r} is over {limit:,} characters", is_error=True)
    return value.strip()


def _object(properties: dict[str, Any], required: Sequence[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


def _string(description: str, max_length: int) -> dict[str, Any]:
    return {"type": "string", "description": description, "minLength": 1, "maxLength": max_length}


_LIBRARY_SEARCH = ToolSpec(
    "search_library",
    "Search the documents in the user's library (in a workspace chat: the workspace's "
    "library) and return the best passages, numbered for citing as [1], [2].",
    _object({"query": _string("what to look for", 200)}, ["query"]),
)


_RECALL_MEMORY = ToolSpec(
    "recall_memory",
    "Recall what you know about the user from earlier conversations (their saved facts).",
    _object({"query": _string("what about the user", 200)}, ["query"]),
)


_SAVE_MEMORY = ToolSpec(
    "save_memory",
    "Save one short fact about the user to their memory, for later conversations.",
    _object({"fact": _string("the fact, in one sentence", 300)}, ["fact"]),
)


_CURRENT_TIME = ToolSpec(
    "current_time",
    "The current date and time (UTC, ISO 8601) and the weekday.",
    _object({}, []),
)


_CALCULATOR = ToolSpec(
    "calculator",
    "Compute an arithmetic expression exactly: + - * / // % ** (or ^), parentheses, "
    "sqrt, log, sin, cos, factorial, pi, e and similar.",
    _object({"expression": _string("e.g. (3 + 4) * sqrt(2)", 500)}, ["expression"]),
    pure=True,
)


_CODE_INTERPRETER = ToolSpec(
    "run_python",
    "Run a Python 3 program in a sandbox (no network, no files kept, the standard "
    "library only) and return what it printed. Print the results you need.",
    _object({"code": _string("the program", 20_000)}, ["code"]),
)


@dataclass(frozen=True)
class LibrarySearch:
    search: SearchLibrary
    k: int = 4
    spec: ToolSpec = _LIBRARY_SEARCH

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        query = _text_arg(arguments, "query", 1000)
        if isinstance(query, ToolResult):
            return query
        found = await self.search(
            context.user_id, context.conversation_id, query, context.workspace_id, self.k
        )
        if not found:
            return ToolResult("No passage in the library matches.")
        blocks, cites = [], []
        for n, p in enumerate(found, 1):
            where = p.document_name + (f", page {p.page}" if p.page else "")
            blocks.append(f"[{n}] ({where})\n{p.text}")
            cites.append(Citation(where, p.document_id, p.text[:SNIPPET_CHARS]))
        return ToolResult("\n\n".join(blocks), citations=tuple(cites))


@dataclass(frozen=True)
class RecallMemory:
    recall: Recall
    k: int = 5
    spec: ToolSpec = _RECALL_MEMORY

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        query = _text_arg(arguments, "query", 1000)
        if isinstance(query, ToolResult):
            return query
        facts = await self.recall(context.user_id, query, self.k)
        return ToolResult("\n".join(f"- {f}" for f in facts) if facts else "Nothing saved.")


@dataclass(frozen=True)
class SaveMemory:
    save: Save
    cacheable: bool = False  # it changes the memory: every call is made
    spec: ToolSpec = _SAVE_MEMORY

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        fact = _text_arg(arguments, "fact", 500)
        if isinstance(fact, ToolResult):
            return fact
        try:
            kept = await self.save(context.user_id, fact, context.conversation_id)
        except Exception as exc:  # refused by moderation or zero-data-retention: say why
            return ToolResult(str(exc) or "the fact was not saved", is_error=True)
        return ToolResult(f"Saved: {kept}")


@dataclass(frozen=True)
class CurrentTime:
    cacheable: bool = False  # the answer changes every second
    spec: ToolSpec = _CURRENT_TIME

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        now = dt.datetime.now(dt.UTC).replace(microsecond=0)
        return ToolResult(f"{now.isoformat()} ({now.strftime('%A')})")


@dataclass(frozen=True)
class Calculator:
    spec: ToolSpec = _CALCULATOR

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        expression = _text_arg(arguments, "expression", 500)
        if isinstance(expression, ToolResult):
            return expression
        try:
            return ToolResult(repr(calculate(expression)))
        except CalculatorError as exc:
            return ToolResult(str(exc), is_error=True)


@dataclass(frozen=True)
class CodeInterpreter:
    sandbox: Sandbox
    spec: ToolSpec = _CODE_INTERPRETER

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        code = _text_arg(arguments, "code", 20_000)
        if isinstance(code, ToolResult):
            return code
        left = context.deadline - time.monotonic()
        if left <= 0.5:
            return ToolResult("no time left in this turn's tool budget", is_error=True)
        limits = replace(self.sandbox.limits, wall_s=min(self.sandbox.limits.wall_s, left))
        try:
            done = await replace(self.sandbox, limits=limits).run(code)
        except (ValueError, OSError) as exc:
            return ToolResult(f"the sandbox could not run it: {exc}", is_error=True)
        parts = []
        if done.stdout:
            parts.append(done.stdout.rstrip("\n"))
        if done.stderr:
            parts.append(f"stderr:\n{done.stderr.rstrip()}")
        if done.timed_out:
            parts.append(f"(stopped: over {limits.wall_s:g} s)")
        elif done.truncated:
            parts.append("(stopped: too much output)")
        elif done.exit_code != 0:
            parts.append(
                f"(exit status {done.exit_code}{', ' + done.signal if done.signal else ''})"
            )
        return ToolResult("\n".join(parts) or "(no output)", is_error=not done.ok)


def catalogue() -> list[tuple[ToolSpec, bool, bool]]:
    """Every built-in tool as offered: its spec, whether it is offered in workspace chats
    too (memory is personal), and whether only to tiers with the code interpreter."""
    return [
        (_LIBRARY_SEARCH, True, False),
        (_RECALL_MEMORY, False, False),
        (_SAVE_MEMORY, False, False),
        (_CURRENT_TIME, True, False),
        (_CALCULATOR, True, False),
        (_CODE_INTERPRETER, True, True),
    ]


@dataclass
class BuiltinToolbox:
    """The built-in tools for a call's context: memory only outside workspaces, the code
    interpreter only for tiers whose policy enables it."""

    search: SearchLibrary | None = None
    recall: Recall | None = None
    save: Save | None = None
    sandbox: Sandbox | None = None
    code_enabled: CodeEnabled = lambda tier: False

    async def tools(self, context: ToolContext) -> Sequence[Tool]:
        out: list[Tool] = []
        if self.search is not None:
            out.append(LibrarySearch(self.search))
        if context.workspace_id is None:
            if self.recall is not None:
                out.append(RecallMemory(self.recall))
            if self.save is not None:
                out.append(SaveMemory(self.save))
        out += [CurrentTime(), Calculator()]
        if self.sandbox is not None and self.code_enabled(context.tier):
            out.append(CodeInterpreter(self.sandbox))
        return out
