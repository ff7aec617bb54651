"""A workspace's page: its conversations, its members (owners add and remove them; a member
may leave) and its document library (any member adds and deletes), with htmx partials.
Anyone outside the workspace gets 404 on every one of these routes."""

from __future__ import annotations

from typing import Annotated

from litestar import Controller, Response, get, post
from litestar.types import ExceptionHandlersMap

from chatbox.accounts import User
from chatbox.chat.teams.workspaces import Workspace, Workspaces
from chatbox.web.api.workspaces import (
    MemberIn,
    WorkspacesDep,
    add_document,
    workspace_conversations,
)
from chatbox.web.deps import ChatDep, KnowledgeDep, UserDep
from chatbox.web.ui.helpers import FORM, UI_EXCEPTION_HANDLERS, AnyRequest, html, sidebar, ui_error
from chatbox.web.ui.library import document_row
from chatbox.web.urls import reverse


def library_ui_error(request: AnyRequest, exc: Exception) -> Response[str]:
    """The attachment path's alert, worded for the workspace's library."""
    return ui_error(request, exc, "Not added to the workspace's library")


async def _library(
    request: AnyRequest, workspaces: Workspaces, user: User, ws: Workspace, notice: str = ""
) -> Response[str]:
    docs = [document_row(d) for d in await workspaces.library(user, ws.id)]
    return html(request, "_library_list.html", documents=docs, ws=ws, notice=notice)


class WorkspacePagesController(Controller):
    """`/w/{id}` and its partials under `/ui/w/{id}/`."""

    include_in_schema = False
    exception_handlers: ExceptionHandlersMap = {
        cls: library_ui_error for cls in UI_EXCEPTION_HANDLERS
    }

    @get("/w/{ws_id:str}", name="workspace_page")
    async def page(
        self,
        request: AnyRequest,
        workspaces: WorkspacesDep,
        chat: ChatDep,
        user: UserDep,
        ws_id: str,
    ) -> Response[str]:
        ws, role = await workspaces.get(user, ws_id)
        docs = [document_row(d) for d in await workspaces.library(user, ws.id)]
        return html(
            request,
            "workspace.html",
            ws=ws,
            role=role,
            manager=role == "owner" or user.role == "admin",
            members=await workspaces.members(user, ws.id),
            ws_convs=await workspace_conversations(chat, user, ws.id),
            documents=docs,
            notice="",
            me=user,
            conv=None,
            **await sidebar(chat, user),
        )

    @post("/ui/w/{ws_id:str}/members", status_code=200, name="workspace_add_member")
    async def add_member(
        self,
        request: AnyRequest,
        workspaces: WorkspacesDep,
        user: UserDep,
        ws_id: str,
        data: Annotated[MemberIn, FORM],
    ) -> Response[str]:
        await workspaces.add_member(user, ws_id, data.name, "member")
        back = reverse(request, "workspace_page", ws_id=ws_id)
        return Response("", headers={"HX-Redirect": back})

    @post(
        "/ui/w/{ws_id:str}/members/{user_id:str}/delete",
        status_code=200,
        name="workspace_remove_member",
    )
    async def remove_member(
        self,
        request: AnyRequest,
        workspaces: WorkspacesDep,
        user: UserDep,
        ws_id: str,
        user_id: str,
    ) -> Response[str]:
        await workspaces.remove_member(user, ws_id, user_id)
        left = user_id == user.id
        back = reverse(request, "home") if left else reverse(request, "workspace_page", ws_id=ws_id)
        return Response("", headers={"HX-Redirect": back})

    @post(
        "/ui/w/{ws_id:str}/documents",
        status_code=200,
        request_max_body_size=None,
        name="workspace_upload",
    )
    async def upload(
        self,
        request: AnyRequest,
        workspaces: WorkspacesDep,
        knowledge: KnowledgeDep,
        user: UserDep,
        ws_id: str,
    ) -> Response[str]:
        """Add a file (multipart field `file`) to the library; answer with the list."""
        doc = await add_document(request, workspaces, knowledge, user, ws_id)
        ws, _ = await workspaces.get(user, ws_id)
        return await _library(request, workspaces, user, ws, f"Added {doc.name}.")

    @post(
        "/ui/w/{ws_id:str}/documents/{doc_id:str}/delete",
        status_code=200,
        name="workspace_remove_document",
    )
    async def remove_document(
        self, request: AnyRequest, workspaces: WorkspacesDep, user: UserDep, ws_id: str, doc_id: str
    ) -> Response[str]:
        """Any member deletes one of the workspace's documents (its passages go too)."""
        ws, _ = await workspaces.get(user, ws_id)
        names = {d.id: d.name for d in await workspaces.library(user, ws.id)}
        await workspaces.delete_document(user, ws.id, doc_id)
        notice = f"Deleted {names.get(doc_id, 'the document')}."
        return await _library(request, workspaces, user, ws, notice)
