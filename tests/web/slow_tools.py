"""A toolbox for served tests (`CHATBOX_TOOLBOXES=tests.web.slow_tools:toolbox`): one tool
that takes a minute unless it is stopped, and takes no arguments (so a scripted call of it
is exactly `{}`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from chatbox.chat.tools.base import Tool, Toolbox, ToolContext, ToolResult, ToolSpec

SLOW = ToolSpec(
    "wait_a_minute",
    "Waits a minute.",
    {"type": "object", "properties": {}, "additionalProperties": False},
    source="test",
)


@dataclass(frozen=True)
class Slow:
    spec: ToolSpec = SLOW

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        await asyncio.sleep(60)
        return ToolResult("waited")


@dataclass(frozen=True)
class SlowBox:
    async def tools(self, context: ToolContext) -> Sequence[Tool]:
        return [Slow()]


def toolbox() -> Toolbox:
    return SlowBox()
