"""What a tool is to the chat: its spec for the model, the context of a call, and its result."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ToolSpec:
    """How the model sees a tool: an OpenAI-style function with a JSON-schema for its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]
    source: str = "builtin"  # "builtin", or "mcp:<server name>"
    version: str = "1"  # part of the tool-result cache key
    pure: bool = False  # same arguments give the same result for every user (cacheable per user)
    approval: bool = False  # may have side effects: each call waits for the user's approval


@dataclass(frozen=True)
class Citation:
    """A source a tool's result quotes (a library document's chunk)."""

    title: str
    document_id: str
    snippet: str


@dataclass(frozen=True)
class ToolContext:
    """Who a call runs for, and by when it must finish (a `time.monotonic()` deadline)."""

    user_id: str
    conversation_id: str | None
    workspace_id: str | None
    deadline: float
    tier: str = ""


@dataclass(frozen=True)
class ToolResult:
    """A call's outcome as the model reads it; an error is a result too, never an exception."""

    text: str
    is_error: bool = False
    citations: Sequence[Citation] = field(default_factory=tuple)


class Tool(Protocol):
    """One callable tool."""

    @property
    def spec(self) -> ToolSpec: ...

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        """Run the call; failures and timeouts come back as `ToolResult(is_error=True)`."""
        ...


class Toolbox(Protocol):
    """A source of tools: the built-ins, or one MCP server."""

    async def tools(self, context: ToolContext) -> Sequence[Tool]:
        """The tools this source offers for `context` (may be empty)."""
        ...
