"""A small MCP server written with the SDK, for tests: `python mcp_server.py [--http PORT]`.

Its tools: add(a, b), echo(text), sleep(seconds), crash() (the process exits mid-call),
fail(reason) (an error result) and pid() (which process answers).
"""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("chatbox-test")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Return the text as given."""
    return text


@server.tool()
async def sleep(seconds: float) -> str:
    """Wait, then say how long."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def crash() -> str:
    """Exit the server process at once."""
    os._exit(3)


@server.tool()
def fail(reason: str) -> str:
    """Raise an error (the server answers with an error result)."""
    raise ToolError(reason)


@server.tool()
def pid() -> int:
    """This server process's id."""
    return os.getpid()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
