"""Deciding on a tool call that waits for the user (a tool that may have side effects):
`POST /v1/conversations/{id}/tool-calls/{call_id}/approval`."""

from __future__ import annotations

from dataclasses import dataclass

from litestar import Controller, post
from litestar.status_codes import HTTP_204_NO_CONTENT

from chatbox.web.deps import ChatDep, UserDep


@dataclass
class ApprovalIn:
    """The decision: true runs this one call, false gives the model a denial."""

    allow: bool


class ToolApprovalController(Controller):
    path = "/v1/conversations"
    tags = ["conversations"]

    @post("/{conv_id:str}/tool-calls/{call_id:str}/approval", status_code=HTTP_204_NO_CONTENT)
    async def decide(
        self, chat: ChatDep, user: UserDep, conv_id: str, call_id: str, data: ApprovalIn
    ) -> None:
        """Allow or deny a call the running answer waits on (its stream's `tool_approval`
        event); 404 unless the answer is yours and that call waits. Audited."""
        await chat.decide_tool_call(user, conv_id, call_id, data.allow)
