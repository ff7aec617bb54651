"""The MCP servers admins configure: adding, checking, marking and removing them (audited),
and the toolboxes each call's context is offered (chatbox/chat/tools/mcp.py holds the
connections and the tools they list)."""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from chatbox.accounts import AuditLog
from chatbox.accounts.audit import Actor
from chatbox.chat.errors import InvalidInput, NotFound
from chatbox.chat.tools.base import Tool, ToolContext, ToolResult
from chatbox.chat.tools.mcp import (
    CHECK_S,
    CLOSE_WAIT_S,
    NAME,
    REAPING,
    McpConnection,
    McpTool,
    McpToolbox,
    describe,
)
from chatbox.store import McpServerRow, Store, User


def _pairs(items: Iterable[str], sep: str, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, found, value = item.partition(sep)
        if not found or not key.strip():
            raise InvalidInput(f"{what} {item.split(sep)[0]!r} must be given as NAME{sep}VALUE")
        out[key.strip()] = value.strip() if sep == ":" else value
    return out


class McpServers:
    """The MCP servers admins configured, their open sessions, and the calls made to them."""

    def __init__(self, store: Store, audit: AuditLog, known_tiers: Iterable[str] = ()) -> None:
        self.store = store
        self.audit = audit
        self.known_tiers = frozenset(known_tiers)
        self.connections: dict[str, McpConnection] = {}
        self._closing: set[asyncio.Task[None]] = set()

    # -- configuration (admins) ---------------------------------------------------------------

    async def add(
        self,
        actor: Actor | User,
        name: str,
        *,
        command: str = "",
        url: str = "",
        env: Iterable[str] = (),
        headers: Iterable[str] = (),
        tiers: Iterable[str] = (),
        workspaces: Iterable[str] = (),
        commands: bool = True,
    ) -> dict[str, Any]:
        """Add (or replace) a server; InvalidInput names what is wrong with it. Audited.
        `commands` False refuses stdio servers (the console: a command runs as this process's
        OS user, which can read every conversation in the data directory)."""
        name = name.strip()
        if not NAME.match(name):
            raise InvalidInput(
                "a server's name is 1-32 lowercase letters, digits, - or _ (starting with a"
                " letter or digit)"
            )
        command, url = command.strip(), url.strip()
        if bool(command) == bool(url):
            raise InvalidInput("give a server either a command (stdio) or a URL (HTTP)")
        if command and not commands:
            raise InvalidInput(
                "a command runs on this machine as chatbox's own user: add it on the box with"
                " `chatbox tools add NAME --command ...`; the console adds URL servers"
            )
        if command:
            try:
                argv = shlex.split(command)
            except ValueError as exc:
                raise InvalidInput(f"the command cannot be split into words: {exc}") from exc
            if not argv:
                raise InvalidInput("the command is empty")
        else:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise InvalidInput("the URL must be an http:// or https:// address")
        env_map = _pairs(env, "=", "environment variable")
        header_map = _pairs(headers, ":", "header")
        if (command and header_map) or (url and env_map):
            raise InvalidInput("headers go with a URL server, environment variables with a command")
        tier_list = tuple(dict.fromkeys(t.strip() for t in tiers if t.strip()))
        unknown = [t for t in tier_list if self.known_tiers and t not in self.known_tiers]
        if unknown:
            known = ", ".join(sorted(self.known_tiers))
            raise InvalidInput(f"no tier {unknown[0]!r} in the policy (tiers: {known})")
        ws_ids: list[str] = []
        for ref in workspaces:
            ws = await self.store.workspaces.get(ref.strip())
            if ws is None:
                raise InvalidInput(f"no workspace {ref.strip()!r}")
            ws_ids.append(ws.id)
        row = await self.store.mcp_servers.put(
            name,
            "stdio" if command else "http",
            command=command,
            url=url,
            env=env_map,
            headers=header_map,
            tiers=tier_list,
            workspaces=tuple(dict.fromkeys(ws_ids)),
        )
        await self.audit.record(
            actor,
            "mcp.add",
            server=name,
            transport=row.transport,
            tiers=list(row.tiers),
            workspaces=list(row.workspaces),
        )
        self._forget(name)
        return describe(row)

    async def mark(
        self, actor: Actor | User, name: str, tools: Iterable[str], read_only: bool
    ) -> dict[str, Any]:
        """Mark some of a server's tools (its names for them) read-only, or not: a call of a
        tool that is not read-only waits for the user's approval. NotFound if there is no
        such server. Audited."""
        name = name.strip()
        row = await self.store.mcp_servers.get(name)
        if row is None:
            raise NotFound(f"no MCP server {name!r}")
        names = tuple(dict.fromkeys(t.strip() for t in tools if t.strip()))
        if not names:
            raise InvalidInput("name at least one of the server's tools")
        marked = set(row.read_only)
        marked = marked | set(names) if read_only else marked - set(names)
        row = await self.store.mcp_servers.set_read_only(name, tuple(marked))
        if row is None:
            raise NotFound(f"no MCP server {name!r}")
        await self.audit.record(
            actor, "mcp.read_only", server=name, tools=list(names), read_only=read_only
        )
        return describe(row)

    async def remove(self, actor: Actor | User, name: str) -> None:
        """Remove a server and close its session; NotFound if there is none. Audited."""
        if not await self.store.mcp_servers.remove(name.strip()):
            raise NotFound(f"no MCP server {name.strip()!r}")
        await self.audit.record(actor, "mcp.remove", server=name.strip())
        self._forget(name.strip())

    async def overview(self) -> list[dict[str, Any]]:
        """Every server: its configuration (no secrets; workspaces by name), state, tools and
        last error."""
        rows = await self._sync()
        names: dict[str, str] = {}
        for ws_id in {w for r in rows for w in r.workspaces}:
            ws = await self.store.workspaces.get(ws_id)
            names[ws_id] = ws.name if ws is not None else ws_id
        views = [self.connections[r.name].view() for r in rows]
        for view in views:  # by name, as admins give them
            view["workspaces"] = [names[w] for w in view["workspaces"]]
        return views

    async def check(self, name: str, deadline_s: float = CHECK_S) -> dict[str, Any]:
        """Open a server's session (if it is not open) and list its tools."""
        rows = {r.name: r for r in await self._sync()}
        if name not in rows:
            raise NotFound(f"no MCP server {name!r}")
        conn = self.connections[name]
        conn._failed_at = 0.0  # an admin's check always tries
        ctx = ToolContext("", None, None, time.monotonic() + deadline_s)
        await McpToolbox(conn, self).tools(ctx)
        return conn.view()

    # -- use (the chat's tool loop) -------------------------------------------------------------

    async def toolboxes(self, context: ToolContext) -> list[McpToolbox]:
        """The servers offered for `context`: those for its tier (or every tier) and its
        workspace (or everywhere)."""
        out = []
        for row in await self._sync():
            if row.tiers and context.tier not in row.tiers:
                continue
            if row.workspaces and context.workspace_id not in row.workspaces:
                continue
            out.append(McpToolbox(self.connections[row.name], self))
        return out

    async def tools(self, context: ToolContext) -> Sequence[Tool]:
        """As one `Toolbox`: the tools of every server offered for `context`, the servers
        asked at once (one slow to start holds up none of the others)."""
        boxes = await self.toolboxes(context)
        found = await asyncio.gather(*(box.tools(context) for box in boxes))
        return [tool for tools in found for tool in tools]

    async def call(
        self, tool: McpTool, arguments: dict[str, Any], context: ToolContext
    ) -> ToolResult:
        """Run one call and record it in the audit log (who, which tool, the outcome; never
        the arguments or the result)."""
        began = time.perf_counter()
        result = await tool.connection.call(tool.remote, arguments, context.deadline)
        user = await self.store.users.get(context.user_id) if context.user_id else None
        actor: Actor | User = user or Actor(context.user_id or None, context.user_id or "unknown")
        await self.audit.record(
            actor,
            "mcp.call",
            server=tool.connection.row.name,
            tool=tool.remote,
            ok=not result.is_error,
            ms=round((time.perf_counter() - began) * 1000, 1),
            conversation_id=context.conversation_id,
            workspace_id=context.workspace_id,
        )
        return result

    async def close(self) -> None:
        """Close every session (stopping the stdio servers)."""
        for name in list(self.connections):
            self._forget(name)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        if REAPING:  # sessions abandoned at a deadline: their processes are being stopped
            await asyncio.wait(list(REAPING), timeout=CLOSE_WAIT_S)

    # -- internals ------------------------------------------------------------------------------

    async def _sync(self) -> list[McpServerRow]:
        """The configured servers, with a connection each; a changed or removed server's
        session is closed (the CLI changes the table under a running server)."""
        rows = await self.store.mcp_servers.list()
        wanted = {r.name: r for r in rows}
        for name, conn in list(self.connections.items()):
            row = wanted.get(name)
            if row is not None and replace(row, read_only=()) == replace(conn.row, read_only=()):
                conn.row = row  # only its read-only marks changed: the session stays open
            elif row != conn.row:
                self._forget(name)
        for row in rows:
            if row.name not in self.connections:
                self.connections[row.name] = McpConnection(row)
        return rows

    def _forget(self, name: str) -> None:
        conn = self.connections.pop(name, None)
        if conn is None:
            return
        task = asyncio.create_task(conn.close(), name=f"mcp-close-{name}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
