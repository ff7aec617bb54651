"""The conversation API: conversations, streamed turns, branches, cancel."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, delete, get, patch, post
from litestar.params import Parameter
from litestar.response import Stream
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT

from chatbox.chat import ChatService, NotFound, TurnRun
from chatbox.web.deps import ChatDep, StoreDep, UserDep
from chatbox.web.schemas import (
    BranchIn,
    ConversationPatch,
    NewConversation,
    RegenerateIn,
    TurnIn,
    conversation_out,
    view_out,
)
from chatbox.web.sse import LastEventId, last_event_id, sse_response


def _stream(request: Request[Any, Any, Any], run: TurnRun, after: int = 0) -> Stream:
    """The answer as SSE; headers name the turn, the model, and the user's rate limits now."""
    heartbeat = request.app.state.settings.heartbeat_s
    chat: ChatService = request.app.state.chat
    user = getattr(request.state, "user", None)
    limits = chat.gate.headers(user) if user is not None else {}
    return sse_response(run, after, heartbeat, headers={
        "X-Turn-Id": run.turn_id, "X-Chatbox-Model": run.model, **limits})


class ConversationController(Controller):
    path = "/v1/conversations"
    tags = ["conversations"]

    @post("/", status_code=HTTP_201_CREATED)
    async def create(
        self, store: StoreDep, chat: ChatDep, user: UserDep, data: NewConversation | None = None
    ) -> dict[str, Any]:
        """Start a conversation; 201 with its id."""
        data = data or NewConversation()
        if data.model is not None:
            chat.resolve_model(data.model)
        conv = await store.conversations.create(user.id, data.title, data.system_prompt,
                                                data.model)
        return conversation_out(conv)

    @get("/")
    async def list_conversations(self, store: StoreDep, user: UserDep) -> dict[str, Any]:
        """The user's conversations, most recently active first."""
        convs = await store.conversations.list(user.id)
        return {"data": [conversation_out(c) for c in convs]}

    @get("/{conv_id:str}")
    async def read(
        self,
        chat: ChatDep,
        user: UserDep,
        conv_id: str,
        before: int | None = Parameter(default=None, ge=1),
        limit: int = Parameter(default=50, ge=1, le=500),
    ) -> dict[str, Any]:
        """The active branch's turns, newest page first (`before` = a turn's cursor)."""
        return view_out(await chat.view(user, conv_id, before, limit))

    @patch("/{conv_id:str}")
    async def update(
        self, store: StoreDep, chat: ChatDep, user: UserDep, conv_id: str, data: ConversationPatch
    ) -> dict[str, Any]:
        """Rename, or change the system prompt or model."""
        changes = {k: v for k, v in vars(data).items() if v is not None}
        if "model" in changes:
            chat.resolve_model(changes["model"])
        conv = await store.conversations.update(user.id, conv_id, **changes)
        if conv is None:
            raise NotFound("conversation not found")
        return conversation_out(conv)

    @delete("/{conv_id:str}", status_code=HTTP_204_NO_CONTENT)
    async def remove(self, chat: ChatDep, user: UserDep, conv_id: str) -> None:
        await chat.delete(user, conv_id)

    @post("/{conv_id:str}/turns", status_code=200)
    async def send(
        self, request: Request[Any, Any, Any], chat: ChatDep, user: UserDep, conv_id: str,
        data: TurnIn,
    ) -> Stream:
        """Send a message; the answer streams as SSE (`token` … then `done` or `error`)."""
        parent = data.parent_id if data.parent_id is not None else "__active__"
        run = await chat.send(user, conv_id, data.content, parent, data.options())
        return _stream(request, run)

    @post("/{conv_id:str}/turns/{turn_id:str}/edit", status_code=200)
    async def edit(
        self, request: Request[Any, Any, Any], chat: ChatDep, user: UserDep, conv_id: str,
        turn_id: str, data: TurnIn,
    ) -> Stream:
        """A new version of an earlier user message, as a new branch; streams its answer."""
        run = await chat.edit(user, conv_id, turn_id, data.content, data.options())
        return _stream(request, run)

    @post("/{conv_id:str}/turns/{turn_id:str}/regenerate", status_code=200)
    async def regenerate(
        self, request: Request[Any, Any, Any], chat: ChatDep, user: UserDep, conv_id: str,
        turn_id: str, data: RegenerateIn | None = None,
    ) -> Stream:
        """Another answer beside this one (a new branch); streams it."""
        options = (data or RegenerateIn()).options()
        run = await chat.regenerate(user, conv_id, turn_id, options)
        return _stream(request, run)

    @get("/{conv_id:str}/turns/{turn_id:str}/events")
    async def resume(
        self, request: Request[Any, Any, Any], chat: ChatDep, user: UserDep, conv_id: str,
        turn_id: str,
        last_id: LastEventId = None,
    ) -> Stream:
        """Reattach to an answer still streaming (or just finished): events after Last-Event-ID."""
        await chat.conversation(user, conv_id)
        run = chat.run_for(conv_id, turn_id)
        if run is None:
            raise NotFound("no running answer with that id; read the conversation instead")
        return _stream(request, run, last_event_id(last_id))

    @post("/{conv_id:str}/branch", status_code=200)
    async def branch(self, chat: ChatDep, user: UserDep, conv_id: str,
                     data: BranchIn) -> dict[str, Any]:
        """Show another branch: the newest leaf under turn_id becomes the active one."""
        await chat.switch_branch(user, conv_id, data.turn_id)
        return view_out(await chat.view(user, conv_id))

    @post("/{conv_id:str}/cancel", status_code=HTTP_204_NO_CONTENT)
    async def cancel(self, chat: ChatDep, user: UserDep, conv_id: str) -> None:
        """Stop the running answer; what was written stays, marked stopped."""
        await chat.cancel(user, conv_id)
