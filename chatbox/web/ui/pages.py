"""The web UI: full pages and the htmx partials behind them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from litestar import Controller, Response, get, post
from litestar.response import Stream

from chatbox.accounts import User
from chatbox.chat import (
    ACTIVE_BRANCH,
    ChatService,
    Conversation,
    InvalidInput,
    NotFound,
    TurnOptions,
    TurnRun,
    TurnView,
)
from chatbox.chat.rollout.feedback import MAX_COMMENT_CHARS
from chatbox.knowledge import Knowledge
from chatbox.web.api.workspaces import WorkspacesDep
from chatbox.web.deps import ChatDep, KnowledgeDep, ServicesDep, SettingsDep, UserDep
from chatbox.web.sse import LastEventId, last_event_id
from chatbox.web.ui.helpers import (
    FORM,
    UI_EXCEPTION_HANDLERS,
    AnyRequest,
    blank,
    chat_context,
    conversation_context,
    html,
    render,
    shown_id,
    sidebar,
    start_chat,
    ui_stream,
    viewing,
)


@dataclass
class MessageForm:
    content: str = ""
    parent_id: str = ""  # the branch shown, when it is not the active one (?turn=)
    model: str = ""
    system_prompt: str = ""
    workspace_id: str = ""  # a new chat started in this workspace
    tools: str = ""  # "on": the composer's tool switch is on (the tier's tools are offered)

    def options(self) -> TurnOptions:
        return TurnOptions(tool_choice="auto" if self.tools == "on" else "none")


@dataclass
class SettingsForm:
    title: str | None = None
    model: str | None = None
    system_prompt: str | None = None
    where: str = ""  # "sidebar": renamed from the sidebar's menu, which is redrawn


@dataclass
class FeedbackForm:
    rating: str = ""
    comment: str = ""


@dataclass
class BranchForm:
    turn_id: str = ""


async def _turn_view(chat: ChatService, user: User, conv_id: str, turn_id: str) -> TurnView:
    view = await chat.view(user, conv_id)
    for tv in view.turns:
        if tv.turn.id == turn_id:
            return tv
    raise NotFound("turn not found")


class PagesController(Controller):
    """HTML pages (`/`, `/c/{id}`) and htmx partials (`/ui/...`)."""

    include_in_schema = False
    exception_handlers = UI_EXCEPTION_HANDLERS

    # -- pages -------------------------------------------------------------------------

    @get("/", name="home")
    async def index(
        self,
        request: AnyRequest,
        chat: ChatDep,
        workspaces: WorkspacesDep,
        user: UserDep,
        workspace: str | None = None,
    ) -> Response[str]:
        """A new, empty chat; `?workspace=ID`: one that starts in that workspace (a member's)."""
        new_in = (await workspaces.get(user, workspace))[0] if workspace else None
        model = chat.expected_model(user, None)
        return html(
            request,
            "chat.html",
            conv=None,
            view=None,
            turns=[],
            running=None,
            documents=[],
            new_in=new_in,
            models=chat.models.names(),
            default_model=model,
            starters=chat.starters(model),
            tool_offer=chat.tool_offer(user),
            **await sidebar(chat, user),
        )

    @get("/c/{conv_id:str}", name="conversation")
    async def conversation(
        self,
        request: AnyRequest,
        chat: ChatDep,
        knowledge: KnowledgeDep,
        user: UserDep,
        conv_id: str,
        turn: str | None = None,
    ) -> Response[str]:
        """One conversation: its active branch, streaming on if an answer is running.

        `?turn=ID` (a search hit) shows the branch holding that turn, far enough back to
        show it, without switching the active branch (a GET changes nothing); a message
        sent from that page continues the branch shown.
        """
        view = await chat.view(user, conv_id, show=turn or None)
        return html(
            request,
            "chat.html",
            **await sidebar(chat, user),
            **await conversation_context(chat, knowledge, user, view),
        )

    # -- sending -----------------------------------------------------------------------

    @post("/ui/new/send", status_code=200, name="send_new")
    async def send_new(
        self,
        request: AnyRequest,
        chat: ChatDep,
        knowledge: KnowledgeDep,
        workspaces: WorkspacesDep,
        user: UserDep,
        data: Annotated[MessageForm, FORM],
    ) -> Response[str]:
        """Start a conversation with its first message (in a workspace with `workspace_id`);
        the page becomes that chat."""
        if not data.content.strip():
            raise InvalidInput("the message is empty")

        async def first(conv: Conversation) -> None:
            if data.workspace_id:  # in the workspace before its first message is answered
                await workspaces.move(user, conv.id, data.workspace_id)
            await chat.send(user, conv.id, data.content, options=data.options())

        return await start_chat(
            request,
            chat,
            knowledge,
            user,
            first,
            data.system_prompt,
            data.model,
            tools_on=data.tools == "on",
        )

    @get("/ui/loading", name="loading")
    async def loading(self, services: ServicesDep, user: UserDep) -> dict[str, dict[str, int]]:
        """Models loading now and the sends waiting for each (a pending send shows it)."""
        return {"loading": services.loading()}

    @post("/ui/c/{conv_id:str}/send", status_code=200, name="send")
    async def send(
        self,
        request: AnyRequest,
        chat: ChatDep,
        user: UserDep,
        conv_id: str,
        data: Annotated[MessageForm, FORM],
    ) -> Response[str]:
        """Append the user's bubble and a streaming answer bubble."""
        run = await chat.send(
            user, conv_id, data.content, data.parent_id or ACTIVE_BRANCH, data.options()
        )
        return await self._appended(request, chat, user, run)

    async def _appended(
        self, request: AnyRequest, chat: ChatService, user: User, run: TurnRun
    ) -> Response[str]:
        conv = await chat.conversation(user, run.conversation_id)
        # The user's bubble with its moderation mark (a warned or flagged message).
        tv = await chat.turn_view(user, conv.id, run.user_turn_id) if run.user_turn_id else None
        body = ""
        if tv is not None:
            authors = {user.id: "You"} if conv.workspace_id else {}
            body += render(request, "_turn.html", conv=conv, tv=tv, authors=authors)
        body += render(request, "_streaming.html", conv=conv, run=run)
        body += render(request, "_sidebar.html", **await sidebar(chat, user), conv=conv, oob=True)
        return Response(body, media_type="text/html")

    @get("/ui/c/{conv_id:str}/turns/{turn_id:str}/stream", name="stream")
    async def stream(
        self,
        request: AnyRequest,
        chat: ChatDep,
        knowledge: KnowledgeDep,
        settings: SettingsDep,
        user: UserDep,
        conv_id: str,
        turn_id: str,
        last_id: LastEventId = None,
    ) -> Stream:
        """SSE for a streaming bubble: rendered HTML as it grows, then the final bubble."""
        return await ui_stream(
            request,
            chat,
            knowledge,
            user,
            conv_id,
            turn_id,
            last_event_id(last_id),
            settings.heartbeat_s,
        )

    @post("/ui/c/{conv_id:str}/stop", status_code=204, name="stop")
    async def stop(self, chat: ChatDep, user: UserDep, conv_id: str) -> None:
        """Stop the running answer; what was written stays, marked stopped."""
        await chat.cancel(user, conv_id)

    # -- branches ----------------------------------------------------------------------

    async def _turns(
        self, request: AnyRequest, chat: ChatService, knowledge: Knowledge, user: User, conv_id: str
    ) -> Response[str]:
        view = await chat.view(user, conv_id)
        context = await conversation_context(chat, knowledge, user, view)
        body = render(request, "_turns.html", **context)
        body += render(request, "_context.html", oob=True, **context)
        return Response(body, media_type="text/html")

    @post("/ui/c/{conv_id:str}/turns/{turn_id:str}/regenerate", status_code=200, name="regenerate")
    async def regenerate(
        self,
        request: AnyRequest,
        chat: ChatDep,
        knowledge: KnowledgeDep,
        user: UserDep,
        conv_id: str,
        turn_id: str,
    ) -> Response[str]:
        """A new answer beside this one (the old stays as a sibling branch)."""
        await chat.regenerate(user, conv_id, turn_id, TurnOptions())
        return await self._turns(request, chat, knowledge, user, conv_id)

    @post("/ui/c/{conv_id:str}/turns/{turn_id:str}/feedback", status_code=200, name="feedback")
    async def feedback(
        self,
        request: AnyRequest,
        chat: ChatDep,
        user: UserDep,
        conv_id: str,
        turn_id: str,
        data: Annotated[FeedbackForm, FORM],
    ) -> Response[str]:
        """Thumbs up or down on an answer; the thumbs come back with a comment field until
        a comment is sent."""
        given = await chat.rate(user, conv_id, turn_id, data.rating, data.comment or None)
        conv = await chat.conversation(user, conv_id)
        turn = await chat.turn(user, conv_id, turn_id)
        return html(
            request,
            "_feedback.html",
            conv=conv,
            t=turn,
            rating=given,
            ask=given.comment is None,
            max_comment=MAX_COMMENT_CHARS,
        )

    @get("/ui/c/{conv_id:str}/turns/{turn_id:str}", name="turn")
    async def turn(
        self, request: AnyRequest, chat: ChatDep, user: UserDep, conv_id: str, turn_id: str
    ) -> Response[str]:
        """One bubble (e.g. to cancel an edit)."""
        view = await chat.view(user, conv_id)
        tv = next((tv for tv in view.turns if tv.turn.id == turn_id), None)
        if tv is None:
            raise NotFound("turn not found")
        authors = await chat.author_names(user, view)
        return html(request, "_turn.html", conv=view.conversation, tv=tv, authors=authors)

    @get("/ui/c/{conv_id:str}/turns/{turn_id:str}/edit", name="edit")
    async def edit_form(
        self, request: AnyRequest, chat: ChatDep, user: UserDep, conv_id: str, turn_id: str
    ) -> Response[str]:
        """The user bubble as an editable form."""
        tv = await _turn_view(chat, user, conv_id, turn_id)
        conv = await chat.conversation(user, conv_id)
        return html(request, "_edit.html", conv=conv, tv=tv)

    @post("/ui/c/{conv_id:str}/turns/{turn_id:str}/edit", status_code=200)
    async def edit(
        self,
        request: AnyRequest,
        chat: ChatDep,
        knowledge: KnowledgeDep,
        user: UserDep,
        conv_id: str,
        turn_id: str,
        data: Annotated[MessageForm, FORM],
    ) -> Response[str]:
        """Send an edited version of a message as a new branch."""
        await chat.edit(user, conv_id, turn_id, data.content)
        return await self._turns(request, chat, knowledge, user, conv_id)

    @post("/ui/c/{conv_id:str}/branch", status_code=200, name="branch")
    async def branch(
        self,
        request: AnyRequest,
        chat: ChatDep,
        knowledge: KnowledgeDep,
        user: UserDep,
        conv_id: str,
        data: Annotated[BranchForm, FORM],
    ) -> Response[str]:
        """Show a sibling branch (‹ 1/2 ›)."""
        await chat.switch_branch(user, conv_id, data.turn_id)
        return await self._turns(request, chat, knowledge, user, conv_id)

    # -- the conversation itself -------------------------------------------------------

    @post("/ui/c/{conv_id:str}/settings", status_code=200, name="settings")
    async def settings(
        self,
        request: AnyRequest,
        chat: ChatDep,
        user: UserDep,
        conv_id: str,
        data: Annotated[SettingsForm, FORM],
    ) -> Response[str]:
        """Rename, pick the model, or set the system prompt."""
        changes: dict[str, Any] = {}
        if data.title is not None:
            changes["title"] = blank(data.title)
        if data.system_prompt is not None:
            changes["system_prompt"] = blank(data.system_prompt)
        if data.model is not None:
            changes["model"] = chat.resolve_model(blank(data.model))
        await chat.update_conversation(user, conv_id, **changes)
        view = await chat.view(user, conv_id)
        context = {**chat_context(chat, view), **await sidebar(chat, user)}
        if data.where == "sidebar":  # the sidebar, and the header if this chat is open
            shown = viewing(request, conv_id)
            side = {**context, "conv": None, "current_id": shown_id(request)}
            body = render(request, "_sidebar.html", **side)
            if shown:
                body += render(request, "_header.html", oob_head=True, **context)
            return Response(body, media_type="text/html")
        body = render(request, "_header.html", **context)
        body += render(request, "_sidebar.html", oob=True, **context)
        return Response(body, media_type="text/html")
