"""MCP servers as toolboxes: each configured server is a `Toolbox` whose tools the model may call.

A server is reached over stdio (a command chatbox starts) or streamable HTTP (a URL), with the
official `mcp` SDK. Its session is opened on first use and kept: calls reuse it (a call costs a
round trip; starting a stdio server costs its process start). A call that outlives its deadline,
a server that dies mid-call, or one that cannot start gives an error result naming the server;
a dead session is opened again on next use. `McpServers` is the service admins configure
servers through (audited), the source of the toolboxes offered for a call's context, and
itself one `Toolbox` holding every offered server's tools.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import shlex
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from chatbox.accounts import AuditLog
from chatbox.accounts.audit import Actor
from chatbox.chat.errors import InvalidInput, NotFound
from chatbox.chat.tools.base import Tool, ToolContext, ToolResult, ToolSpec
from chatbox.observability.logs import redact_urls
from chatbox.store import McpServerRow, Store, User

log = logging.getLogger("chatbox.mcp")

NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
RETRY_AFTER_S = 10.0  # a server that could not start is not tried again for this long
CLOSE_WAIT_S = 10.0  # how long closing a session waits for its process to exit (the SDK: up to 6 s)
CHECK_S = 30.0  # the deadline of an admin's check (connect and list the tools)
MAX_RESULT = 100_000  # characters of a result the model is given
_REAPING: set[asyncio.Task[None]] = set()  # sessions that never opened, being stopped


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside the SDK's task-group exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


NOT_MCP = "its answer is not an MCP message (is the URL the server's MCP endpoint?)"


def _say(exc: BaseException) -> str:
    """What went wrong, in a line: never the body a server answered with (a validation error
    quotes it) and never a URL's secrets."""
    exc = _leaf(exc)
    if _unreadable(exc):
        return NOT_MCP
    lines = str(exc).strip().splitlines()
    text = redact_urls(lines[0][:300]) if lines else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _unreadable(exc: BaseException) -> bool:
    """Whether the server answered with something that is not an MCP (JSON-RPC) message."""
    from mcp import MCPError
    from mcp_types import INVALID_REQUEST, PARSE_ERROR
    from pydantic import ValidationError

    if isinstance(exc, ValidationError | json.JSONDecodeError):
        return True
    return isinstance(exc, MCPError) and exc.error.code in (PARSE_ERROR, INVALID_REQUEST)


def _closed(exc: BaseException) -> bool:
    """Whether the SDK failed a request because its connection closed."""
    from mcp import MCPError
    from mcp_types import CONNECTION_CLOSED

    return isinstance(exc, MCPError) and exc.error.code == CONNECTION_CLOSED


def shown_url(url: str) -> str:
    """A URL without the secrets it may carry: its userinfo and its query's values."""
    return redact_urls(url)


def describe(row: McpServerRow) -> dict[str, Any]:
    """A server's configuration as admins see it: names of its env variables and headers,
    never their values."""
    return {
        "name": row.name,
        "transport": row.transport,
        "target": row.command if row.transport == "stdio" else shown_url(row.url),
        "env": sorted(row.env),
        "headers": sorted(row.headers),
        "tiers": list(row.tiers),
        "workspaces": list(row.workspaces),
        "read_only": list(row.read_only),
        "added_at": row.added_at,
    }


def tool_name(server: str, tool: str) -> str:
    """The name the model calls a server's tool by: unique across servers, within OpenAI's
    function-name alphabet and length."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"{server}__{tool}")[:64]


def _result_text(result: Any) -> str:
    parts: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource" and hasattr(block.resource, "text"):
            parts.append(block.resource.text)
        else:
            parts.append(f"[{kind or 'content'} not shown]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)[:MAX_RESULT]


class McpConnection:
    """One server's session: opened on first use by a task that owns it, reused by calls,
    opened again after it dies."""

    def __init__(self, row: McpServerRow) -> None:
        self.row = row
        self.tools: list[Any] = []  # the SDK's Tool entries, as listed at connect
        self.version = ""  # the server's name and version, part of each tool's version
        self.state = "not started"
        self.last_error = ""
        self.starts = 0
        self.connect_ms: float | None = None
        self.last_call_ms: float | None = None
        self._session: Any = None
        self._owner: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()
        self._failed_at = 0.0

    @property
    def alive(self) -> bool:
        return self._session is not None and self._owner is not None and not self._owner.done()

    def view(self) -> dict[str, Any]:
        return {
            **describe(self.row),
            "state": self.state,
            "last_error": self.last_error,
            "tools": [
                {
                    "name": t.name,
                    "description": t.description or "",
                    "read_only": self.row.is_read_only(t.name),
                }
                for t in self.tools
            ],
            "starts": self.starts,
            "connect_ms": self.connect_ms,
            "last_call_ms": self.last_call_ms,
        }

    @contextlib.asynccontextmanager
    async def _transport(self) -> AsyncIterator[tuple[Any, Any]]:
        if self.row.transport == "stdio":
            from mcp import StdioServerParameters, stdio_client

            argv = shlex.split(self.row.command)
            params = StdioServerParameters(
                command=argv[0], args=argv[1:], env=dict(self.row.env) or None
            )
            async with stdio_client(params) as streams:
                yield streams
        else:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            timeout = httpx2.Timeout(30.0, read=300.0)
            async with (
                httpx2.AsyncClient(headers=self.row.headers, timeout=timeout) as client,
                streamable_http_client(self.row.url, http_client=client) as streams,
            ):
                yield streams[0], streams[1]

    async def _relay(self, source: Any, sink: MemoryObjectSendStream[Any]) -> None:
        """Pass the server's messages to the session; their end means the server is gone."""
        async with sink:
            try:
                async for item in source:
                    if isinstance(item, Exception):
                        self.last_error = _say(item)
                    await sink.send(item)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
        self._stop.set()

    async def _own(self, ready: asyncio.Future[None]) -> None:
        from mcp import ClientSession

        try:
            async with self._transport() as (read, write):
                send: MemoryObjectSendStream[Any]
                receive: MemoryObjectReceiveStream[Any]
                send, receive = anyio.create_memory_object_stream(0)
                async with anyio.create_task_group() as group:
                    group.start_soon(self._relay, read, send)
                    async with ClientSession(receive, write) as session:
                        info = await session.initialize()
                        server = getattr(info, "server_info", None)
                        if server is not None:
                            self.version = f"{server.name} {server.version}"
                        self.tools = await self._list(session)
                        self._session = session
                        ready.set_result(None)
                        await self._stop.wait()
                    group.cancel_scope.cancel()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(_say(exc)))
            elif not isinstance(exc, asyncio.CancelledError):
                self.last_error = _say(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._session = None
            if ready.done() and not ready.cancelled() and ready.exception() is None:
                self.state = "stopped"

    @staticmethod
    async def _list(session: Any) -> list[Any]:
        tools: list[Any] = []
        cursor: str | None = None
        while True:
            if cursor is None:
                page = await session.list_tools()
            else:
                from mcp_types import PaginatedRequestParams

                page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor))
            tools += page.tools
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def session(self) -> Any:
        """The open session, opening one if there is none (the caller bounds the wait)."""
        async with self._lock:
            if self.alive:
                return self._session
            await self._end()
            if time.monotonic() - self._failed_at < RETRY_AFTER_S:
                raise ConnectionError(f"could not start: {self.last_error}")
            self._stop = asyncio.Event()
            ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            began = time.perf_counter()
            self._owner = asyncio.create_task(self._own(ready), name=f"mcp-{self.row.name}")
            try:
                await ready
            except BaseException as exc:
                self._abandon()  # the caller's deadline does not wait for the process to go
                if not isinstance(exc, asyncio.CancelledError):
                    self._failed_at = time.monotonic()
                    self.last_error = _say(exc)
                    self.state = f"failed: {self.last_error}"
                raise
            self.starts += 1
            self.connect_ms = (time.perf_counter() - began) * 1000
            self.state = "connected"
            self.last_error = ""
            return self._session

    def _abandon(self) -> None:
        """Stop a session that never opened, in the background."""
        owner, self._owner = self._owner, None
        self._session = None
        if owner is not None:
            owner.cancel()
            _REAPING.add(owner)
            owner.add_done_callback(_REAPING.discard)

    async def _end(self) -> None:
        owner, self._owner = self._owner, None
        if owner is None:
            return
        self._stop.set()
        try:
            async with asyncio.timeout(CLOSE_WAIT_S):
                await asyncio.gather(owner, return_exceptions=True)
        except TimeoutError:
            owner.cancel()
            await asyncio.gather(owner, return_exceptions=True)
        self._session = None

    def lost(self, why: str) -> None:
        """The session failed under a call: it is opened again on next use."""
        self.last_error = why
        self.state = f"stopped: {why}"
        self._session = None
        self._stop.set()

    async def close(self) -> None:
        async with self._lock:
            await self._end()
        self.state = "stopped"

    async def call(self, tool: str, arguments: dict[str, Any], deadline: float) -> ToolResult:
        """Call a tool by the server's name for it, within `deadline` (monotonic)."""
        name = self.row.name
        left = deadline - time.monotonic()
        if left <= 0:
            return ToolResult(f"MCP server {name}: no time left to call {tool}", is_error=True)
        began = time.perf_counter()
        try:
            async with asyncio.timeout(left):
                try:
                    session = await self.session()
                except Exception as exc:
                    return ToolResult(
                        f"MCP server {name} could not be reached: {_say(exc)}", is_error=True
                    )
                result = await session.call_tool(tool, arguments)
        except TimeoutError:
            return ToolResult(
                f"MCP server {name} did not answer {tool} within {left:.1f} s", is_error=True
            )
        except Exception as exc:
            if _closed(exc):
                self.lost("the server closed the connection")
                return ToolResult(
                    f"MCP server {name} stopped during the call to {tool} (it exited or closed"
                    " the connection); it is started again on next use",
                    is_error=True,
                )
            from mcp import MCPError

            if isinstance(exc, MCPError):  # the server answered with an error
                said = NOT_MCP if _unreadable(exc) else redact_urls(str(exc))
                return ToolResult(f"MCP server {name} refused {tool}: {said}", is_error=True)
            self.lost(_say(exc))
            return ToolResult(f"MCP server {name} failed on {tool}: {_say(exc)}", is_error=True)
        finally:
            self.last_call_ms = (time.perf_counter() - began) * 1000
        text = _result_text(result)
        if result.is_error:
            return ToolResult(f"MCP server {name}, tool {tool}: {text}", is_error=True)
        return ToolResult(text)


@dataclass(frozen=True)
class McpTool:
    """One of a server's tools, as the chat's tool loop sees it."""

    spec: ToolSpec
    remote: str  # the server's name for the tool
    connection: McpConnection
    servers: McpServers

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        return await self.servers.call(self, arguments, context)


class McpToolbox:
    """One configured server's tools."""

    def __init__(self, connection: McpConnection, servers: McpServers) -> None:
        self.connection = connection
        self.servers = servers

    @property
    def name(self) -> str:
        return self.connection.row.name

    async def tools(self, context: ToolContext) -> Sequence[Tool]:
        """The server's tools (opening its session within the context's deadline); none
        while it cannot be reached (its state says why)."""
        conn = self.connection
        try:
            async with asyncio.timeout(max(0.0, context.deadline - time.monotonic())):
                await conn.session()
        except (Exception, TimeoutError) as exc:
            if isinstance(exc, TimeoutError):
                conn.state = f"failed: did not start within the deadline ({_say(exc)})"
            log.warning("MCP server %s offers no tools now: %s", conn.row.name, conn.state)
            return []
        out: list[Tool] = []
        for t in conn.tools:
            schema = dict(t.input_schema or {"type": "object", "properties": {}})
            digest = hashlib.sha256(
                json.dumps([conn.version, t.description, schema], sort_keys=True).encode()
            ).hexdigest()[:12]
            spec = ToolSpec(
                tool_name(conn.row.name, t.name),
                t.description or t.name,
                schema,
                source=f"mcp:{conn.row.name}",
                version=digest,
                approval=not conn.row.is_read_only(t.name),
            )
            out.append(McpTool(spec, t.name, conn, self.servers))
        return out


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
        if _REAPING:  # sessions abandoned at a deadline: their processes are being stopped
            await asyncio.wait(list(_REAPING), timeout=CLOSE_WAIT_S)

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
