"""Calls that wait for the user: a tool that may have side effects (an MCP tool not marked
read-only) runs only once the person the answer is for allows that call. The answer's
stream says what waits (`tool_approval`) and what was decided (`tool_decision`); a call not
decided within the turn's tool time counts as denied. Each decision is audited."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from chatbox.accounts import AuditLog
from chatbox.chat.errors import NotFound
from chatbox.store import User

DENIED = "denied by the user: the call was not made"
EXPIRED = "not allowed by the user within this turn's tool time: the call was not made"


@dataclass
class _Pending:
    user: User
    tool: str
    future: asyncio.Future[bool]


class ToolApprovals:
    """The calls waiting for a decision, by conversation and call id."""

    def __init__(self, audit: AuditLog | None = None) -> None:
        self.audit = audit
        self._waiting: dict[tuple[str, str], _Pending] = {}

    async def ask(
        self,
        user: User,
        conversation_id: str,
        call_id: str,
        tool: str,
        arguments: dict[str, Any],
        seconds: float,
        publish: Callable[[str, dict[str, Any]], object],
    ) -> str | None:
        """Wait up to `seconds` for `user` to decide; None when allowed, else why not."""
        key = (conversation_id, call_id)
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting[key] = _Pending(user, tool, future)
        publish(
            "tool_approval",
            {"id": call_id, "name": tool, "arguments": arguments, "seconds": round(seconds, 1)},
        )
        try:
            try:
                async with asyncio.timeout(max(seconds, 0.0)):
                    allowed = await future
                decision = "allowed" if allowed else "denied"
            except TimeoutError:
                allowed, decision = False, "expired"
                await self._record(user, conversation_id, call_id, tool, decision)
        finally:
            self._waiting.pop(key, None)
        publish("tool_decision", {"id": call_id, "name": tool, "decision": decision})
        if allowed:
            return None
        return DENIED if decision == "denied" else EXPIRED

    async def decide(self, user: User, conversation_id: str, call_id: str, allow: bool) -> None:
        """Allow or deny a waiting call: NotFound unless `user` is the one it waits for."""
        pending = self._waiting.get((conversation_id, call_id))
        if pending is None or pending.user.id != user.id or pending.future.done():
            raise NotFound("no tool call of yours waits for a decision there")
        pending.future.set_result(allow)
        decision = "allowed" if allow else "denied"
        await self._record(user, conversation_id, call_id, pending.tool, decision)

    async def _record(
        self, user: User, conversation_id: str, call_id: str, tool: str, decision: str
    ) -> None:
        if self.audit is not None:
            await self.audit.record(
                user,
                "tool.approval",
                tool=tool,
                call_id=call_id,
                decision=decision,
                conversation_id=conversation_id,
            )
