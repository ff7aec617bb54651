"""The admin console's Workspaces page: every workspace and who is in it (never what is in
it), a form to create one with its first owner, adding owners, deleting a workspace. The
posts are htmx with the session's CSRF token, answer with the page, and are audit-logged."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from litestar import Controller, Response, get, post

from chatbox.accounts import User
from chatbox.accounts.people import People
from chatbox.chat.teams.workspaces import Workspaces
from chatbox.services.server import Services
from chatbox.web.api.workspaces import WorkspacesDep
from chatbox.web.auth import AnyRequest
from chatbox.web.console.actions import page, require_admin
from chatbox.web.deps import ServicesDep, UserDep
from chatbox.web.ui.helpers import FORM, UI_EXCEPTION_HANDLERS


@dataclass
class NewWorkspaceForm:
    name: str = ""
    owner: str = ""  # a user's name: the workspace's first owner
    system_prompt: str = ""


@dataclass
class OwnerForm:
    name: str = ""


async def _page(
    request: AnyRequest, services: Services, workspaces: Workspaces, user: User, notice: str = ""
) -> Response[str]:
    people = await People(services.accounts, user).list()
    return page(
        request,
        "console_workspaces.html",
        "workspaces",
        workspaces=await workspaces.overview(user),
        people=[p.name for p in people if not p.disabled],
        notice=notice,
    )


class ConsoleWorkspacesController(Controller):
    path = "/console/workspaces"
    include_in_schema = False
    exception_handlers = UI_EXCEPTION_HANDLERS

    @get("/", name="console_workspaces")
    async def index(
        self, request: AnyRequest, services: ServicesDep, workspaces: WorkspacesDep, user: UserDep
    ) -> Response[str]:
        require_admin(user)
        return await _page(request, services, workspaces, user)

    @post("/", status_code=200)
    async def create(
        self,
        request: AnyRequest,
        services: ServicesDep,
        workspaces: WorkspacesDep,
        user: UserDep,
        data: Annotated[NewWorkspaceForm, FORM],
    ) -> Response[str]:
        """A new workspace and its owner (who then adds the members on its page)."""
        require_admin(user)
        ws = await workspaces.create(
            user, data.name, data.system_prompt.strip(), data.owner.strip() or None
        )
        notice = f"Created {ws.name}."
        for member in await workspaces.members(user, ws.id, manage=True):  # its owner, if named
            notice = f"Created {ws.name}, owned by {member.name}."
        return await _page(request, services, workspaces, user, notice)

    @post("/{ws_id:str}/owners", status_code=200, name="console_workspace_owner")
    async def add_owner(
        self,
        request: AnyRequest,
        services: ServicesDep,
        workspaces: WorkspacesDep,
        user: UserDep,
        ws_id: str,
        data: Annotated[OwnerForm, FORM],
    ) -> Response[str]:
        require_admin(user)
        member = await workspaces.add_member(user, ws_id, data.name, "owner")
        return await _page(request, services, workspaces, user, f"{member.name} is now an owner.")

    @post("/{ws_id:str}/delete", status_code=200, name="console_workspace_delete")
    async def delete(
        self,
        request: AnyRequest,
        services: ServicesDep,
        workspaces: WorkspacesDep,
        user: UserDep,
        ws_id: str,
    ) -> Response[str]:
        """Erase the workspace's conversations and documents, then it."""
        require_admin(user)
        ws, _ = await workspaces.get(user, ws_id, manage=True)
        await workspaces.delete(user, ws.id)
        return await _page(
            request, services, workspaces, user, f"Deleted {ws.name} and all it held."
        )
