"""The conversation API: conversations, streamed turns, branches, cancel."""

from __future__ import annotations

from litestar import Controller, delete, get, patch, post
from litestar.params import Parameter
from litestar.response import Stream
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT

from chatbox.accounts import User
from chatbox.chat import ACTIVE_BRANCH, ChatService, InvalidInput, NotFound, TurnRun
from chatbox.chat.privacy.temporary import is_temporary
from chatbox.settings import Settings
from chatbox.web.api.data import TemporaryChatOut
from chatbox.web.api.schemas import (
    BranchIn,
    ConversationOut,
    ConversationPatch,
    ConversationsOut,
    ConversationViewOut,
    FeedbackIn,
    FeedbackOut,
    NewConversation,
    RegenerateIn,
    TurnIn,
    pick,
)
from chatbox.web.api.shares import SharingDep
from chatbox.web.auth import AnyRequest
from chatbox.web.deps import ChatDep, DataServiceDep, SettingsDep, UserDep
from chatbox.web.intake import MAX_ID
from chatbox.web.sse import LastEventId, last_event_id, sse_response

ZDR_NO_BRANCHES = (
    "zero-data-retention: an edit or a regeneration would be stored as a new branch; "
    "send the message instead (it is answered and not stored)"
)


ZDR_NO_TOOLS = "zero-data-retention: tools are offered only in stored chats (their calls are turns)"


def _stream(
    chat: ChatService, settings: Settings, user: User, run: TurnRun, after: int = 0
) -> Stream:
    """The answer as SSE; headers name the turn, the model, and the user's rate limits now."""
    return sse_response(
        run,
        after,
        settings.heartbeat_s,
        headers={
            "X-Turn-Id": run.turn_id,
            "X-Chatbox-Model": run.model,
            **chat.limit_headers(user),
        },
    )


class ConversationController(Controller):
    path = "/v1/conversations"
    tags = ["conversations"]

    @post("/", status_code=HTTP_201_CREATED)
    async def create(
        self,
        request: AnyRequest,
        chat: ChatDep,
        data_service: DataServiceDep,
        user: UserDep,
        data: NewConversation | None = None,
    ) -> ConversationOut | TemporaryChatOut:
        """Start a conversation; 201 with its id. `temporary` (or zero-data-retention for
        the request, key, user or tier): a chat kept in RAM only, never stored."""
        data = data or NewConversation()
        if data.temporary or await data_service.stores_nothing(user):
            temporary = data_service.create_temporary(user, data.system_prompt, data.model)
            return TemporaryChatOut.of(temporary)
        conv = await chat.create_conversation(user, data.title, data.system_prompt, data.model)
        return pick(ConversationOut, conv)

    @get("/")
    async def list_conversations(self, chat: ChatDep, user: UserDep) -> ConversationsOut:
        """The user's conversations, most recently active first."""
        return ConversationsOut([pick(ConversationOut, c) for c in await chat.conversations(user)])

    @get("/{conv_id:str}")
    async def read(
        self,
        chat: ChatDep,
        data_service: DataServiceDep,
        user: UserDep,
        conv_id: str,
        before: int | None = Parameter(default=None, ge=1, le=MAX_ID),
        limit: int = Parameter(default=50, ge=1, le=500),
    ) -> ConversationViewOut | TemporaryChatOut:
        """The active branch's turns, newest page first (`before` = a turn's cursor)."""
        if is_temporary(conv_id):
            return TemporaryChatOut.of(data_service.temporary.get(user, conv_id))
        return ConversationViewOut.of_view(await chat.view(user, conv_id, before, limit))

    @patch("/{conv_id:str}")
    async def update(
        self, chat: ChatDep, user: UserDep, conv_id: str, data: ConversationPatch
    ) -> ConversationOut:
        """Rename, or change the system prompt or model."""
        changes = {k: v for k, v in vars(data).items() if v is not None}
        return pick(ConversationOut, await chat.update_conversation(user, conv_id, **changes))

    @delete("/{conv_id:str}", status_code=HTTP_204_NO_CONTENT)
    async def remove(
        self,
        chat: ChatDep,
        data_service: DataServiceDep,
        sharing: SharingDep,
        user: UserDep,
        conv_id: str,
        revoke_links: bool = Parameter(
            default=False,
            description="Also revoke the conversation's share links (default: they stay "
            "readable, being snapshots).",
        ),
    ) -> None:
        """Erase the conversation and everything made from it (a temporary chat: forget it).
        Its share links stay readable unless `revoke_links=true` (they are snapshots)."""
        if is_temporary(conv_id):
            data_service.temporary.delete(user, conv_id)
            return
        await chat.delete(user, conv_id)
        if revoke_links:
            await sharing.revoke_conversation(user, conv_id)

    @post("/{conv_id:str}/turns", status_code=200)
    async def send(
        self,
        request: AnyRequest,
        chat: ChatDep,
        data_service: DataServiceDep,
        settings: SettingsDep,
        user: UserDep,
        conv_id: str,
        data: TurnIn,
    ) -> Stream:
        """Send a message; the answer streams as SSE (`token` … then `done` or `error`).
        Under zero-data-retention the answer streams and nothing is written."""
        if is_temporary(conv_id):
            if data.options().force_tools:
                raise InvalidInput(ZDR_NO_TOOLS, "tool_choice")
            run = await data_service.temporary.send(user, conv_id, data.content, data.options())
            return _stream(chat, settings, user, run)
        if await data_service.stores_nothing(user):
            if data.options().force_tools:
                raise InvalidInput(ZDR_NO_TOOLS, "tool_choice")
            run = await data_service.answer_unsaved(user, conv_id, data.content, data.options())
            return _stream(chat, settings, user, run)
        parent = data.parent_id if data.parent_id is not None else ACTIVE_BRANCH
        run = await chat.send(user, conv_id, data.content, parent, data.options())
        return _stream(chat, settings, user, run)

    @post("/{conv_id:str}/turns/{turn_id:str}/edit", status_code=200)
    async def edit(
        self,
        request: AnyRequest,
        chat: ChatDep,
        data_service: DataServiceDep,
        settings: SettingsDep,
        user: UserDep,
        conv_id: str,
        turn_id: str,
        data: TurnIn,
    ) -> Stream:
        """A new version of an earlier user message, as a new branch; streams its answer."""
        if await data_service.stores_nothing(user):
            raise InvalidInput(ZDR_NO_BRANCHES)
        run = await chat.edit(user, conv_id, turn_id, data.content, data.options())
        return _stream(chat, settings, user, run)

    @post("/{conv_id:str}/turns/{turn_id:str}/regenerate", status_code=200)
    async def regenerate(
        self,
        request: AnyRequest,
        chat: ChatDep,
        data_service: DataServiceDep,
        settings: SettingsDep,
        user: UserDep,
        conv_id: str,
        turn_id: str,
        data: RegenerateIn | None = None,
    ) -> Stream:
        """Another answer beside this one (a new branch); streams it."""
        if await data_service.stores_nothing(user):
            raise InvalidInput(ZDR_NO_BRANCHES)
        options = (data or RegenerateIn()).options()
        run = await chat.regenerate(user, conv_id, turn_id, options)
        return _stream(chat, settings, user, run)

    @post("/{conv_id:str}/turns/{turn_id:str}/feedback", status_code=HTTP_201_CREATED)
    async def give_feedback(
        self, chat: ChatDep, user: UserDep, conv_id: str, turn_id: str, data: FeedbackIn
    ) -> FeedbackOut:
        """Rate an answer `up` or `down`, with an optional `comment`; a new rating replaces
        the caller's earlier one. 404 unless the caller sees the conversation; 422 under
        zero-data-retention (nothing is stored), for a message or for a temporary chat."""
        given = await chat.rate(user, conv_id, turn_id, data.rating, data.comment)
        return FeedbackOut.of(given, turn_id)

    @get("/{conv_id:str}/turns/{turn_id:str}/feedback")
    async def read_feedback(
        self, chat: ChatDep, user: UserDep, conv_id: str, turn_id: str
    ) -> FeedbackOut:
        """The caller's rating of an answer that counts now (`rating` null: not rated)."""
        return FeedbackOut.of(await chat.rating(user, conv_id, turn_id), turn_id)

    @get("/{conv_id:str}/turns/{turn_id:str}/events")
    async def resume(
        self,
        chat: ChatDep,
        data_service: DataServiceDep,
        settings: SettingsDep,
        user: UserDep,
        conv_id: str,
        turn_id: str,
        last_id: LastEventId = None,
    ) -> Stream:
        """Reattach to an answer still streaming (or just finished): events after Last-Event-ID."""
        if is_temporary(conv_id):
            found = data_service.temporary.get(user, conv_id).run
            run = found if found is not None and found.turn_id == turn_id else None
        else:
            await chat.conversation(user, conv_id)
            run = await chat.find_run(conv_id, turn_id)
            if run is None:  # another front's, which cannot relay it: its end as stored
                run = await chat.stored_end(conv_id, turn_id, last_event_id(last_id))
        if run is None:
            raise NotFound("no running answer with that id; read the conversation instead")
        return _stream(chat, settings, user, run, last_event_id(last_id))

    @post("/{conv_id:str}/branch", status_code=200)
    async def branch(
        self, chat: ChatDep, user: UserDep, conv_id: str, data: BranchIn
    ) -> ConversationViewOut:
        """Show another branch: the newest leaf under turn_id becomes the active one."""
        await chat.switch_branch(user, conv_id, data.turn_id)
        return ConversationViewOut.of_view(await chat.view(user, conv_id))

    @post("/{conv_id:str}/cancel", status_code=HTTP_204_NO_CONTENT)
    async def cancel(
        self, chat: ChatDep, data_service: DataServiceDep, user: UserDep, conv_id: str
    ) -> None:
        """Stop the running answer; what was written stays, marked stopped."""
        if is_temporary(conv_id):
            data_service.temporary.cancel(user, conv_id)
            return
        await chat.cancel(user, conv_id)
