"""The admin console's Tools page: the MCP servers, their state and tools (never their
secrets), forms to add a URL server (reached once to list its tools), to remove or check
one, and to mark a tool read-only or not. Command (stdio) servers are added with the CLI
only: a command runs as this process's OS user. The posts are htmx with the session's CSRF
token, answer with the page, and are audit-logged."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from litestar import Controller, Response, get, post
from litestar.exceptions import NotFoundException

from chatbox.accounts import User
from chatbox.chat.tools.mcp_servers import McpServers
from chatbox.services.server import Services
from chatbox.web.auth import AnyRequest
from chatbox.web.console.actions import page, require_admin
from chatbox.web.deps import ServicesDep, UserDep
from chatbox.web.ui.helpers import FORM, UI_EXCEPTION_HANDLERS


@dataclass
class NewServerForm:
    name: str = ""
    command: str = ""  # refused: commands are added with the CLI on the box
    url: str = ""
    tiers: str = ""  # comma-separated; empty: every tier
    workspaces: str = ""  # comma-separated names or ids; empty: everywhere
    env: str = ""  # NAME=VALUE lines
    headers: str = ""  # "Name: value" lines


@dataclass
class MarkForm:
    tool: str = ""
    read_only: str = ""  # non-empty: read-only


def _servers(services: Services) -> McpServers:
    if services.mcp is None:
        raise NotFoundException("MCP servers are not managed in this process")
    return services.mcp


def _words(text: str, sep: str) -> list[str]:
    return [w.strip() for w in text.split(sep) if w.strip()]


async def _page(
    request: AnyRequest, services: Services, user: User, notice: str = ""
) -> Response[str]:
    require_admin(user)
    servers = await _servers(services).overview()
    tiers = sorted(services.policy.tiers) if services.policy is not None else []
    return page(request, "console_tools.html", "tools", servers=servers, tiers=tiers, notice=notice)


class ConsoleToolsController(Controller):
    path = "/console/tools"
    include_in_schema = False
    exception_handlers = UI_EXCEPTION_HANDLERS

    @get("/", name="console_tools")
    async def index(
        self, request: AnyRequest, services: ServicesDep, user: UserDep
    ) -> Response[str]:
        return await _page(request, services, user)

    @post("/", status_code=200)
    async def add(
        self,
        request: AnyRequest,
        services: ServicesDep,
        user: UserDep,
        data: Annotated[NewServerForm, FORM],
    ) -> Response[str]:
        """Add a server, then start it once to show its tools (or why it offers none)."""
        require_admin(user)
        servers = _servers(services)
        view = await servers.add(
            user,
            data.name,
            command=data.command,
            url=data.url,
            env=_words(data.env, "\n"),
            headers=_words(data.headers, "\n"),
            tiers=_words(data.tiers, ","),
            workspaces=_words(data.workspaces, ","),
            commands=False,  # a command runs as this process's user: the operator's CLI only
        )
        view = await servers.check(view["name"])
        found = ", ".join(t["name"] for t in view["tools"])
        notice = (
            f"Added {view['name']}: {found}."
            if found
            else f"Added {view['name']}, which offers no tools now ({view['state']})."
        )
        return await _page(request, services, user, notice)

    @post("/{server:str}/check", status_code=200, name="console_tool_check")
    async def check(
        self, request: AnyRequest, services: ServicesDep, user: UserDep, server: str
    ) -> Response[str]:
        """Start a server (if it is not running) and list its tools (the parameter is not
        `name`, which reversal takes itself)."""
        require_admin(user)
        view = await _servers(services).check(server)
        return await _page(request, services, user, f"{view['name']}: {view['state']}.")

    @post("/{server:str}/mark", status_code=200, name="console_tool_mark")
    async def mark(
        self,
        request: AnyRequest,
        services: ServicesDep,
        user: UserDep,
        server: str,
        data: Annotated[MarkForm, FORM],
    ) -> Response[str]:
        """Mark one of a server's tools read-only (it runs without asking) or not (each
        call waits for the user's approval)."""
        require_admin(user)
        read_only = bool(data.read_only)
        await _servers(services).mark(user, server, [data.tool], read_only)
        said = "read-only" if read_only else "not read-only: each call asks the user first"
        return await _page(request, services, user, f"{server}: {data.tool} is {said}.")

    @post("/{server:str}/remove", status_code=200, name="console_tool_remove")
    async def remove(
        self, request: AnyRequest, services: ServicesDep, user: UserDep, server: str
    ) -> Response[str]:
        """Remove a server; its session is closed and its tools are no longer offered."""
        require_admin(user)
        await _servers(services).remove(user, server)
        return await _page(request, services, user, f"Removed {server}.")
