"""What an MCP tool call costs: on a kept session against a new session per call.

    python benchmarks/mcp_calls.py [--calls 200] [--spawned 5]

Runs the tests' MCP server (tests/chat/mcp_server.py, written with the SDK) over stdio, as
`chatbox/chat/tools/mcp.py` does for an admin's server:
1. Kept session (what chatbox does): the first call starts the server; then `--calls` calls
   of `add`, in sequence, on the session kept open.
2. A new session per call: `--spawned` calls, each starting the server, calling, stopping it.
Prints a table (p50 and p99 ms) and writes benchmarks/results/mcp_calls.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chatbox.accounts import AuditLog  # noqa: E402
from chatbox.accounts.audit import Actor  # noqa: E402
from chatbox.chat.tools.base import ToolContext  # noqa: E402
from chatbox.chat.tools.mcp import McpConnection, McpServers  # noqa: E402
from chatbox.store import Store  # noqa: E402

COMMAND = f"{sys.executable} {ROOT / 'tests' / 'chat' / 'mcp_server.py'}"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(calls: int, spawned: int) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory() as where:
        store = await Store.open(Path(where) / "db.sqlite")
        servers = McpServers(store, AuditLog(store))
        await servers.add(Actor(None, "bench"), "bench", command=COMMAND)
        row = await store.mcp_servers.get("bench")
        assert row is not None

        def ctx() -> ToolContext:
            return ToolContext("", None, None, time.monotonic() + 60)

        kept = McpConnection(row)
        began = time.perf_counter()
        first = await kept.call("add", {"a": 1, "b": 2}, ctx().deadline)
        start_ms = (time.perf_counter() - began) * 1000
        assert first.text == "3", first
        warm: list[float] = []
        for i in range(calls):
            began = time.perf_counter()
            result = await kept.call("add", {"a": i, "b": 1}, ctx().deadline)
            warm.append((time.perf_counter() - began) * 1000)
            assert not result.is_error, result
        await kept.close()

        fresh: list[float] = []
        for i in range(spawned):
            conn = McpConnection(row)
            began = time.perf_counter()
            result = await conn.call("add", {"a": i, "b": 1}, ctx().deadline)
            await conn.close()
            fresh.append((time.perf_counter() - began) * 1000)
            assert not result.is_error, result
        await servers.close()
        await store.close()
    return {
        "first call (starts the server)": {"n": 1, "p50_ms": start_ms, "p99_ms": start_ms},
        "kept session": {"n": calls, "p50_ms": pct(warm, 0.5), "p99_ms": pct(warm, 0.99)},
        "new session per call": {
            "n": spawned,
            "p50_ms": statistics.median(fresh),
            "p99_ms": pct(fresh, 0.99),
        },
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--spawned", type=int, default=5)
    args = parser.parse_args()
    table = asyncio.run(main(args.calls, args.spawned))
    print(f"{'MCP call over stdio':32} {'n':>5} {'p50 ms':>9} {'p99 ms':>9}")
    for name, row in table.items():
        print(f"{name:32} {row['n']:>5.0f} {row['p50_ms']:>9.1f} {row['p99_ms']:>9.1f}")
    out = ROOT / "benchmarks" / "results" / "mcp_calls.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(table, indent=2))
