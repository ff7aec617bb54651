"""MCP servers as toolboxes: each configured server is a `Toolbox` whose tools the model may call.

A server is reached over stdio (a command chatbox starts) or streamable HTTP (a URL), with the
official `mcp` SDK. Its session is opened on first use and kept: calls reuse it (a call costs a
round trip; starting a stdio server costs its process start). A call that outlives its deadline,
a server that dies mid-call, or one that cannot start gives an error result naming the server;
a dead session is opened again on next use. `McpServers` (mcp_servers.py) is the service
admins configure servers through (audited), the source of the toolboxes offered for a call's
context, and itself one `Toolbox` holding every offered server's tools.
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
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from chatbox.chat.tools.base import Tool, ToolContext, ToolResult, ToolSpec
from chatbox.observability.logs import redact_urls
from chatbox.store import McpServerRow

log = logging.getLogger("chatbox.mcp")

NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
RETRY_AFTER_S = 10.0  # a server that could not start is not tried again for this long
CLOSE_WAIT_S = 10.0  # how long closing a session waits for its process to exit (the SDK: up to 6 s)
CHECK_S = 30.0  # the deadline of an admin's check (connect and list the tools)
MAX_RESULT = 100_000  # characters of a result the model is given
REAPING: set[asyncio.Task[None]] = set()  # sessions that never opened, being stopped


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
            REAPING.add(owner)
            owner.add_done_callback(REAPING.discard)

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


class Caller(Protocol):
    """What a tool needs of the service that owns it (McpServers, mcp_servers.py): a call
    run and audited."""

    async def call(
        self, tool: McpTool, arguments: dict[str, Any], context: ToolContext
    ) -> ToolResult: ...


@dataclass(frozen=True)
class McpTool:
    """One of a server's tools, as the chat's tool loop sees it."""

    spec: ToolSpec
    remote: str  # the server's name for the tool
    connection: McpConnection
    servers: Caller

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        return await self.servers.call(self, arguments, context)


class McpToolbox:
    """One configured server's tools."""

    def __init__(self, connection: McpConnection, servers: Caller) -> None:
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
