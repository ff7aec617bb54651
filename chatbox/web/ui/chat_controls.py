"""The chat header's controls that reach beyond the chat itself (htmx partials): its share
links, the delete dialog (which asks what becomes of those links), and the move into a
workspace (or back to the starter's own chats)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from litestar import Controller, Response, get, post

from chatbox.accounts import User
from chatbox.chat import ChatService, NotFound
from chatbox.chat.teams.shares import Share, Sharing
from chatbox.web.api.shares import SharingDep
from chatbox.web.api.workspaces import WorkspacesDep
from chatbox.web.deps import ChatDep, UserDep
from chatbox.web.ui.helpers import (
    FORM,
    UI_EXCEPTION_HANDLERS,
    AnyRequest,
    chat_context,
    html,
    render,
    shown_id,
    sidebar,
    viewing,
)
from chatbox.web.urls import reverse


@dataclass
class DeleteForm:
    revoke_links: str = ""  # "true": revoke the chat's share links too; else they stay
    where: str = ""  # "sidebar": asked from the sidebar's menu, which is redrawn


@dataclass
class ApprovalForm:
    allow: str = ""  # "1": run the call; else deny it


@dataclass
class MoveForm:
    workspace_id: str = ""  # "": back out of its workspace


def absolute(request: AnyRequest, path: str) -> str:
    """A path as a full URL on the address the browser used (what a reader is sent)."""
    return f"{str(request.base_url).rstrip('/')}{path}"


async def _share_panel(
    request: AnyRequest,
    chat: ChatService,
    sharing: Sharing,
    user: User,
    conv_id: str,
    /,
    **extra: Any,
) -> Response[str]:
    conv = await chat.conversation(user, conv_id)
    links = [_link_row(s) for s in await sharing.links(user, conv.id)]
    return html(
        request,
        "_share_panel.html",
        conv=conv,
        links=links,
        allowed=sharing.allowed(user),
        **extra,
    )


def _link_row(share: Share) -> dict[str, Any]:
    """What the share panel shows of a link (its address is never kept, only its hash)."""
    return {
        "id": share.id,
        "turns": share.turns,
        "made_at": share.created_at,  # shown in the reader's zone (the `when` filter)
    }


class ChatControlsController(Controller):
    """`/ui/c/{id}/shares…`, `/ui/c/{id}/delete`, `/ui/c/{id}/workspace`."""

    include_in_schema = False
    exception_handlers = UI_EXCEPTION_HANDLERS

    # -- share links -----------------------------------------------------------------------

    @get("/ui/c/{conv_id:str}/shares", name="shares")
    async def share_panel(
        self, request: AnyRequest, chat: ChatDep, sharing: SharingDep, user: UserDep, conv_id: str
    ) -> Response[str]:
        """The chat's live links (its starter only: anyone else gets 404)."""
        return await _share_panel(request, chat, sharing, user, conv_id)

    @post("/ui/c/{conv_id:str}/shares", status_code=200)
    async def share(
        self, request: AnyRequest, chat: ChatDep, sharing: SharingDep, user: UserDep, conv_id: str
    ) -> Response[str]:
        """A new link to a snapshot of the chat as it is now; its address is shown once."""
        share, token = await sharing.share(user, conv_id)
        url = absolute(request, reverse(request, "share_page", token=token))
        return await _share_panel(request, chat, sharing, user, conv_id, url=url, new=share.id)

    @post("/ui/c/{conv_id:str}/shares/{share_id:str}/revoke", status_code=200, name="revoke_share")
    async def revoke(
        self,
        request: AnyRequest,
        chat: ChatDep,
        sharing: SharingDep,
        user: UserDep,
        conv_id: str,
        share_id: str,
    ) -> Response[str]:
        """Revoke one of the chat's links: it answers 404 from now on."""
        if share_id not in {s.id for s in await sharing.links(user, conv_id)}:
            raise NotFound("share link not found")
        await sharing.revoke(user, share_id)
        notice = "Link revoked: it no longer opens."
        return await _share_panel(request, chat, sharing, user, conv_id, notice=notice)

    # -- deleting --------------------------------------------------------------------------

    @get("/ui/c/{conv_id:str}/delete", name="delete")
    async def delete_dialog(
        self, request: AnyRequest, chat: ChatDep, sharing: SharingDep, user: UserDep, conv_id: str
    ) -> Response[str]:
        """Asks before deleting; with live share links, whether they go too. `?where=sidebar`:
        asked from the sidebar's menu."""
        conv = await chat.conversation(user, conv_id)
        links = await sharing.links(user, conv.id) if conv.user_id == user.id else []
        where = "sidebar" if request.query_params.get("where") == "sidebar" else ""
        return html(request, "_delete_dialog.html", conv=conv, links=len(links), where=where)

    @post("/ui/c/{conv_id:str}/delete", status_code=200)
    async def delete(
        self,
        request: AnyRequest,
        chat: ChatDep,
        sharing: SharingDep,
        user: UserDep,
        conv_id: str,
        data: Annotated[DeleteForm, FORM],
    ) -> Response[str]:
        """Delete the conversation (its links stay unless `revoke_links` is "true"), then
        go to a new chat; from the sidebar, of another chat than the one open, redraw the
        sidebar instead. The links are snapshots, so keeping them is safe."""
        await chat.delete(user, conv_id)
        if data.revoke_links == "true":
            await sharing.revoke_conversation(user, conv_id)
        if data.where != "sidebar" or viewing(request, conv_id):
            return Response("", headers={"HX-Redirect": reverse(request, "home")})
        side = await sidebar(chat, user)
        body = render(request, "_sidebar.html", **side, conv=None, current_id=shown_id(request))
        body += '<div id="side-dialog" hx-swap-oob="true"></div>'
        return Response(body, media_type="text/html")

    # -- tool approval ---------------------------------------------------------------------

    @post("/ui/c/{conv_id:str}/tool-calls/{call_id:str}", status_code=200, name="approve_tool")
    async def approve_tool(
        self,
        chat: ChatDep,
        user: UserDep,
        conv_id: str,
        call_id: str,
        data: Annotated[ApprovalForm, FORM],
    ) -> Response[str]:
        """Allow once or deny a waiting tool call; the answer's stream then shows the rest."""
        allow = data.allow == "1"
        await chat.decide_tool_call(user, conv_id, call_id, allow)
        said = "Allowed once" if allow else "Denied"
        return Response(f'<p class="small muted" role="status">{said}.</p>', media_type="text/html")

    # -- workspaces ------------------------------------------------------------------------

    @post("/ui/c/{conv_id:str}/workspace", status_code=200, name="move")
    async def move(
        self,
        request: AnyRequest,
        chat: ChatDep,
        workspaces: WorkspacesDep,
        user: UserDep,
        conv_id: str,
        data: Annotated[MoveForm, FORM],
    ) -> Response[str]:
        """Move the user's own chat into a workspace they belong to ("" : back out); the
        header (which names the workspace) and the sidebar (which marks it) are redrawn."""
        await workspaces.move(user, conv_id, data.workspace_id or None)
        view = await chat.view(user, conv_id)
        context = {**chat_context(chat, view), **await sidebar(chat, user)}
        body = render(request, "_header.html", **context)
        body += render(request, "_sidebar.html", oob=True, **context)
        return Response(body, media_type="text/html")
