"""MCP servers as toolboxes, against a real MCP server written with the SDK
(tests/chat/mcp_server.py) started as a subprocess, over stdio and over streamable HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from chatbox.accounts import AuditLog
from chatbox.accounts.audit import Actor
from chatbox.chat.errors import InvalidInput, NotFound
from chatbox.chat.tools.base import Toolbox, ToolContext
from chatbox.chat.tools.mcp import McpTool
from chatbox.chat.tools.mcp_servers import McpServers
from chatbox.store import Store

SERVER = Path(__file__).with_name("mcp_server.py")
COMMAND = f"{sys.executable} {SERVER}"
ADMIN = Actor(None, "cli:test")


def ctx(seconds: float = 30.0, tier: str = "free", workspace: str | None = None) -> ToolContext:
    return ToolContext("", "conv-1", workspace, time.monotonic() + seconds, tier)


@pytest.fixture
async def store(database: Path | str) -> AsyncIterator[Store]:
    store = await Store.open(database)
    yield store
    await store.close()


@pytest.fixture
async def servers(store: Store) -> AsyncIterator[McpServers]:
    servers = McpServers(store, AuditLog(store), ["free", "paid"])
    yield servers
    await servers.close()


async def tools_of(servers: McpServers, context: ToolContext) -> dict[str, McpTool]:
    out: dict[str, McpTool] = {}
    for box in await servers.toolboxes(context):
        for tool in await box.tools(context):
            assert isinstance(tool, McpTool)
            out[tool.spec.name] = tool
    return out


async def test_a_stdio_server_lists_its_tools_and_answers_calls_on_one_session(
    servers: McpServers, store: Store
) -> None:
    await servers.add(ADMIN, "calc", command=COMMAND)
    tools = await tools_of(servers, ctx())
    assert set(tools) == {f"calc__{t}" for t in ("add", "echo", "sleep", "crash", "fail", "pid")}
    add = tools["calc__add"]
    assert add.spec.source == "mcp:calc"
    assert add.spec.parameters["required"] == ["a", "b"]
    assert add.spec.description == "Add two integers."

    # numbers no timing in the audit entry can contain by chance
    result = await add.run({"a": 123456, "b": 654321}, ctx())
    assert (result.text, result.is_error) == ("777777", False)
    failed = await tools["calc__fail"].run({"reason": "no such city"}, ctx())
    assert failed.is_error and "MCP server calc" in failed.text and "no such city" in failed.text
    pid = await tools["calc__pid"].run({}, ctx())
    again = await tools["calc__pid"].run({}, ctx())
    assert pid.text == again.text  # the session is reused: the same server process answers
    conn = servers.connections["calc"]
    print(f"\nstdio MCP: session start {conn.connect_ms:.0f} ms, a call {conn.last_call_ms:.1f} ms")

    calls = [e for e in await AuditLog(store).entries(action="mcp.call")]
    assert len(calls) == 4
    assert {e.detail["tool"] for e in calls} == {"add", "fail", "pid"}
    assert all(e.detail["server"] == "calc" for e in calls)
    assert [e.detail["ok"] for e in calls if e.detail["tool"] == "fail"] == [False]
    for e in calls:  # neither the arguments nor the results are recorded
        assert not any(x in str(e.detail) for x in ("123456", "654321", "777777", "city")), e


async def test_a_hanging_call_fails_at_its_deadline_and_the_server_keeps_answering(
    servers: McpServers,
) -> None:
    await servers.add(ADMIN, "calc", command=COMMAND)
    tools = await tools_of(servers, ctx())
    began = time.monotonic()
    result = await tools["calc__sleep"].run({"seconds": 60}, ctx(seconds=1.5))
    took = time.monotonic() - began
    assert result.is_error
    assert "calc" in result.text and "did not answer sleep" in result.text
    assert took < 30  # the deadline, not the server's 60 s
    after = await tools["calc__echo"].run({"text": "still here"}, ctx())
    assert (after.text, after.is_error) == ("still here", False)


async def test_a_crashed_server_fails_its_call_and_is_started_again_on_next_use(
    servers: McpServers, store: Store
) -> None:
    await servers.add(ADMIN, "calc", command=COMMAND)
    tools = await tools_of(servers, ctx())
    first = (await tools["calc__pid"].run({}, ctx())).text
    crashed = await tools["calc__crash"].run({}, ctx())
    assert crashed.is_error
    assert "MCP server calc stopped during the call to crash" in crashed.text
    result = await tools["calc__add"].run({"a": 1, "b": 1}, ctx())
    assert (result.text, result.is_error) == ("2", False)
    second = (await tools["calc__pid"].run({}, ctx())).text
    assert second != first  # a new process
    outcomes = [e.detail["ok"] for e in await AuditLog(store).entries(action="mcp.call")]
    assert outcomes.count(False) == 1


async def test_a_server_killed_while_idle_is_started_again_on_next_use(
    servers: McpServers,
) -> None:
    await servers.add(ADMIN, "calc", command=COMMAND)
    tools = await tools_of(servers, ctx())
    pid = int((await tools["calc__pid"].run({}, ctx())).text)
    os.kill(pid, signal.SIGKILL)
    await asyncio.sleep(1)  # idle: nothing calls it
    result = await tools["calc__add"].run({"a": 3, "b": 4}, ctx())
    assert (result.text, result.is_error) == ("7", False)


async def test_a_server_that_cannot_start_offers_no_tools_and_says_why(
    servers: McpServers,
) -> None:
    await servers.add(ADMIN, "ghost", command="/nonexistent/mcp-server --stdio")
    assert await tools_of(servers, ctx()) == {}
    (view,) = await servers.overview()
    assert view["state"].startswith("failed")


async def test_a_server_that_never_answers_fails_within_the_deadline(servers: McpServers) -> None:
    await servers.add(ADMIN, "mute", command=f"{sys.executable} -c 'import time; time.sleep(600)'")
    began = time.monotonic()
    assert await tools_of(servers, ctx(seconds=2)) == {}
    assert time.monotonic() - began < 30  # the deadline, not the process's 600 s
    (view,) = await servers.overview()
    assert view["state"].startswith("failed") and "deadline" in view["state"]


async def test_servers_are_offered_per_tier_and_workspace(
    servers: McpServers, store: Store
) -> None:
    ws = await store.workspaces.create("research")
    await servers.add(ADMIN, "everywhere", command=COMMAND)
    await servers.add(ADMIN, "paidonly", command=COMMAND, tiers=["paid"])
    await servers.add(ADMIN, "team", command=COMMAND, workspaces=["research"])

    def offered(context: ToolContext) -> set[str]:
        return {b.name for b in boxes[context]}

    contexts = [ctx(tier="free"), ctx(tier="paid"), ctx(tier="free", workspace=ws.id)]
    boxes = {c: await servers.toolboxes(c) for c in contexts}
    assert offered(contexts[0]) == {"everywhere"}
    assert offered(contexts[1]) == {"everywhere", "paidonly"}
    assert offered(contexts[2]) == {"everywhere", "team"}
    one: Toolbox = servers  # every server as one toolbox
    as_one = {t.spec.source for t in await one.tools(contexts[1])}
    assert as_one == {"mcp:everywhere", "mcp:paidonly"}
    views = {v["name"]: v for v in await servers.overview()}
    assert views["team"]["workspaces"] == ["research"] and views["paidonly"]["tiers"] == ["paid"]


async def test_bad_configurations_are_refused_with_a_reason(servers: McpServers) -> None:
    cases = [
        (dict(name="Bad Name", command=COMMAND), "name"),
        (dict(name="x", command=COMMAND, url="http://h/mcp"), "either"),
        (dict(name="x"), "either"),
        (dict(name="x", url="ftp://h/mcp"), "http"),
        (dict(name="x", command=COMMAND, tiers=["gold"]), "gold"),
        (dict(name="x", command=COMMAND, workspaces=["nope"]), "nope"),
        (dict(name="x", command=COMMAND, env=["NOVALUE"]), "NAME=VALUE"),
        (dict(name="x", command=COMMAND, headers=["A: b"]), "headers go with a URL"),
    ]
    for kwargs, says in cases:
        with pytest.raises(InvalidInput, match=says):
            await servers.add(ADMIN, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(NotFound):
        await servers.remove(ADMIN, "never-added")


async def test_secrets_in_a_configuration_are_not_shown_back(servers: McpServers) -> None:
    await servers.add(ADMIN, "withenv", command=COMMAND, env=["API_TOKEN=s3cr3t-env"])
    await servers.add(
        ADMIN,
        "withheaders",
        url="https://bob:pa55word@mcp.example/mcp",
        headers=["Authorization: Bearer s3cr3t-header"],
    )
    shown = str(await servers.overview())
    assert "API_TOKEN" in shown and "Authorization" in shown
    for secret in ("s3cr3t-env", "s3cr3t-header", "pa55word"):
        assert secret not in shown


@contextlib.contextmanager
def serve_http(port: int = 0) -> Iterator[str]:
    """The test server over streamable HTTP, in a subprocess; yields its endpoint URL."""
    from tests.served import free_port

    port = port or free_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), "--http", str(port)])
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def http_server() -> Iterator[str]:
    with serve_http() as url:
        yield url


async def test_a_streamable_http_server_answers_calls(
    servers: McpServers, http_server: str
) -> None:
    await servers.add(ADMIN, "remote", url=http_server, headers=["X-Test: 1"])
    tools = await tools_of(servers, ctx())
    assert "remote__add" in tools
    result = await tools["remote__add"].run({"a": 20, "b": 22}, ctx())
    assert (result.text, result.is_error) == ("42", False)
    hung = await tools["remote__sleep"].run({"seconds": 60}, ctx(seconds=1.5))
    assert hung.is_error and "MCP server remote did not answer sleep" in hung.text
    again = await tools["remote__echo"].run({"text": "ok"}, ctx())
    assert (again.text, again.is_error) == ("ok", False)


async def test_an_http_server_that_goes_away_fails_the_call_and_is_reached_again(
    servers: McpServers,
) -> None:
    from tests.served import free_port

    port = free_port()
    with serve_http(port) as url:
        await servers.add(ADMIN, "remote", url=url)
        tools = await tools_of(servers, ctx())
        assert (await tools["remote__add"].run({"a": 1, "b": 2}, ctx())).text == "3"
    began = time.monotonic()
    gone = await tools["remote__add"].run({"a": 1, "b": 2}, ctx(seconds=10))
    assert gone.is_error and "MCP server remote" in gone.text
    assert time.monotonic() - began < 30
    with serve_http(port):
        back = await tools["remote__add"].run({"a": 2, "b": 2}, ctx())
        assert (back.text, back.is_error) == ("4", False)


async def test_removing_a_server_closes_its_session_and_stops_offering_it(
    servers: McpServers, store: Store
) -> None:
    await servers.add(ADMIN, "calc", command=COMMAND)
    tools = await tools_of(servers, ctx())
    pid = int((await tools["calc__pid"].run({}, ctx())).text)
    await servers.remove(ADMIN, "calc")
    assert await servers.toolboxes(ctx()) == []
    await servers.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _running(pid):
        time.sleep(0.1)
    assert not _running(pid)
    actions = [e.action for e in await AuditLog(store).entries()]
    assert "mcp.add" in actions and "mcp.remove" in actions


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) counts as stopped
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
