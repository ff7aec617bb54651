"""One answer's tools: what is offered to the model, each call run within the turn's budget
of calls and seconds, and results cached per conversation (per user for a pure tool).

The cache key is a hash of the scope, the tool's source, name and version, and its
canonical arguments. Every cached result belongs to the conversation whose call made it,
a pure tool's too (its result is then found from the user's other conversations as well),
so it is erased with that conversation, by retention and with the account; a call outside
any conversation is not cached. An error is never cached, nor a tool marked `cacheable = False` (one
with side effects, or whose answer changes by itself: the time), nor one whose calls wait for
the user's approval (each call is made, once allowed). The caller says whether
anything may be kept (`keep`: False under zero-data-retention), and then nothing is read
from or written to the cache.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from chatbox.chat.tools.base import Citation, Tool, Toolbox, ToolContext, ToolResult
from chatbox.engine.types import ToolSpec as EngineToolSpec

log = logging.getLogger(__name__)


class ToolCache(Protocol):
    async def get(self, key: str, user_id: str) -> str | None: ...

    async def put(
        self, key: str, user_id: str, conversation_id: str, tool: str, result: str
    ) -> None: ...


# (call id, tool name, arguments, seconds left) -> None when allowed, else why not
Approve = Callable[[str, str, dict[str, Any], float], Awaitable[str | None]]


@dataclass(frozen=True)
class Budget:
    """What one answer's tools may use: calls, and wall seconds all together."""

    calls: int
    seconds: float


@dataclass(frozen=True)
class Step:
    """One call made and its result."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    result: ToolResult
    cached: bool = False
    seconds: float = 0.0

    def call_json(self) -> dict[str, Any]:
        return {"id": self.call_id, "name": self.name, "arguments": self.arguments}

    def result_json(self) -> dict[str, Any]:
        return {
            "id": self.call_id,
            "name": self.name,
            **result_dict(self.result),
            "cached": self.cached,
            "seconds": round(self.seconds, 3),
        }


def result_dict(result: ToolResult) -> dict[str, Any]:
    return {
        "text": result.text,
        "is_error": result.is_error,
        "citations": [
            {"title": c.title, "document_id": c.document_id, "snippet": c.snippet}
            for c in result.citations
        ],
    }


def result_from(data: dict[str, Any]) -> ToolResult:
    return ToolResult(
        str(data.get("text", "")),
        bool(data.get("is_error")),
        tuple(
            Citation(str(c["title"]), str(c["document_id"]), str(c["snippet"]))
            for c in data.get("citations", ())
        ),
    )


async def gather_tools(toolboxes: Sequence[Toolbox], context: ToolContext) -> list[Tool]:
    """Every toolbox's tools for `context`; a toolbox that fails offers none (logged)."""
    out: list[Tool] = []
    seen: set[str] = set()
    for box in toolboxes:
        try:
            tools = await box.tools(context)
        except Exception:
            log.exception("a toolbox failed to list its tools; it offers none this turn")
            continue
        for tool in tools:
            if tool.spec.name not in seen:  # the first toolbox's tool of a name wins
                seen.add(tool.spec.name)
                out.append(tool)
    return out


@dataclass
class ToolSession:
    """One answer's tools, budget and cache."""

    tools: Sequence[Tool]
    context: ToolContext  # each call gets it with the deadline its seconds left give
    budget: Budget
    cache: ToolCache | None = None
    keep: bool = True  # False: zero-data-retention (no cache read or write)
    approve: Approve | None = None  # asks the user before a call of a tool marked `approval`
    steps: list[Step] = field(default_factory=list)
    spent: float = 0.0  # seconds the calls took so far
    _by_name: dict[str, Tool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._by_name = {t.spec.name: t for t in self.tools}

    @property
    def calls_left(self) -> int:
        return max(0, self.budget.calls - len(self.steps))

    @property
    def open(self) -> bool:
        """Whether the model may still call a tool in this answer."""
        return bool(self.tools) and self.calls_left > 0 and self.spent < self.budget.seconds

    def cancelled(self, call_id: str, name: str, arguments: Any) -> Step:
        """The step of a call stopped by the user."""
        args = arguments if isinstance(arguments, dict) else {}
        return Step(call_id, name, args, ToolResult("stopped by the user", is_error=True))

    def specs(self) -> tuple[EngineToolSpec, ...]:
        return tuple(
            EngineToolSpec(t.spec.name, t.spec.description, json.dumps(t.spec.parameters))
            for t in self.tools
        )

    def names(self) -> list[str]:
        return [t.spec.name for t in self.tools]

    async def call(self, call_id: str, name: str, arguments_text: str) -> Step:
        """Run one call (the caller cancels the task to stop it); never raises for the
        tool's own failures: they are error results the model reads."""
        started = time.monotonic()
        try:
            return await self._call(call_id, name, arguments_text, started)
        finally:
            self.spent += time.monotonic() - started

    async def _call(self, call_id: str, name: str, arguments_text: str, started: float) -> Step:
        try:
            arguments = json.loads(arguments_text) if arguments_text.strip() else {}
        except ValueError:
            arguments = {}
            step = Step(call_id, name, {}, ToolResult("the arguments are not JSON", True))
            self.steps.append(step)
            return step
        if not isinstance(arguments, dict):
            arguments = {}
        tool = self._by_name.get(name)
        if tool is None:
            result = ToolResult(f"there is no tool named {name!r}", is_error=True)
            step = Step(call_id, name, arguments, result)
        else:
            step = await self._run(tool, call_id, arguments, started)
        self.steps.append(step)
        return step

    async def _run(
        self, tool: Tool, call_id: str, arguments: dict[str, Any], started: float
    ) -> Step:
        spec = tool.spec
        key = self._key(tool, arguments)
        if key is not None and self.cache is not None:
            hit = await self.cache.get(key, self.context.user_id)
            if hit is not None:
                result = result_from(json.loads(hit))
                return Step(call_id, spec.name, arguments, result, True, time.monotonic() - started)
        left = max(self.budget.seconds - self.spent, 0.01)
        if spec.approval:  # it may have side effects: the user allows this call, or not
            refused: str | None = "no one can be asked to allow it here: the call was not made"
            if self.approve is not None:
                refused = await self.approve(call_id, spec.name, arguments, left)
            if refused is not None:
                result = ToolResult(refused, is_error=True)
                took = time.monotonic() - started
                return Step(call_id, spec.name, arguments, result, False, took)
            left = max(self.budget.seconds - self.spent - (time.monotonic() - started), 0.01)
        context = replace(self.context, deadline=time.monotonic() + left)
        try:
            async with asyncio.timeout(left):
                result = await tool.run(arguments, context)
        except TimeoutError:
            result = ToolResult(
                f"{spec.name} did not finish within this turn's tool time "
                f"({self.budget.seconds:g} s in all)",
                is_error=True,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a tool's bug fails its call, never the turn
            log.exception("tool %s failed", spec.name)
            result = ToolResult(f"{spec.name} failed: {exc}", is_error=True)
        conv = self.context.conversation_id
        if key is not None and self.cache is not None and conv and not result.is_error:
            body = json.dumps(result_dict(result), ensure_ascii=False)
            await self.cache.put(key, self.context.user_id, conv, spec.name, body)
        return Step(call_id, spec.name, arguments, result, False, time.monotonic() - started)

    def _key(self, tool: Tool, arguments: dict[str, Any]) -> str | None:
        """The cache key of this call, or None when it is not cached."""
        spec = tool.spec
        if not self.keep or not getattr(tool, "cacheable", True) or spec.approval:
            return None
        if not self.context.conversation_id:
            return None  # nothing to erase it with but the account: not kept
        if spec.pure:
            scope = f"user:{self.context.user_id}"
        else:
            scope = f"conversation:{self.context.conversation_id}"
        args = json.dumps(arguments, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        raw = json.dumps([scope, spec.source, spec.name, spec.version, args])
        return hashlib.sha256(raw.encode()).hexdigest()
