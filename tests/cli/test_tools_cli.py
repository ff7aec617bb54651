"""`chatbox tools list | mark`: every tool the assistant may be offered, where (which tiers,
which chats) and, for an MCP server's tools, whether each is read-only; marking is audited."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.cli.test_accounts_cli import cli, data_dir  # noqa: F401  (a fixture)
from tests.conftest import store_env

SERVER = Path(__file__).parent.parent / "chat" / "mcp_server.py"
POLICY = """
[tiers.free]
tool_calls = 4

[tiers.paid]
tool_calls = 8
code_interpreter = true

[tiers.none]
tool_calls = 0
"""


def rows(table: str) -> dict[str, list[str]]:
    """The tools table's rows by tool name (columns split on runs of spaces)."""
    out = {}
    for line in table.splitlines():
        cells = [c for c in line.split("  ") if c.strip()]
        if cells:
            out[cells[0].strip()] = [c.strip() for c in cells[1:]]
    return out


def test_tools_list_shows_builtins_and_mcp_tools_with_tiers_and_read_only(
    data_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    env = {"CHATBOX_POLICY_PATH": str(policy)}
    command = f"{sys.executable} {SERVER}"
    added = cli(
        data_dir,
        "tools",
        "add",
        "calc",
        "--command",
        command,
        "--tier",
        "paid",
        "--no-check",
        env=env,
    )
    assert added.exit_code == 0, added.output

    marked = cli(data_dir, "tools", "mark", "calc", "add", "echo", "--read-only", env=env)
    assert marked.exit_code == 0, marked.output
    assert "read-only tools: add, echo" in marked.output
    again = cli(data_dir, "tools", "mark", "calc", "echo", "--not-read-only", env=env)
    assert "read-only tools: add " in again.output
    assert cli(data_dir, "tools", "mark", "nope", "add", "--read-only", env=env).exit_code != 0

    # A stdio server needs real standard streams: this one runs as an operator runs it.
    listed = subprocess.run(
        [sys.executable, "-m", "chatbox", "--data-dir", str(data_dir), "tools", "list", "--check"],
        env={**os.environ, **store_env(data_dir), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    table = rows(listed.stdout)
    for name in ("search_library", "recall_memory", "save_memory", "calculator", "current_time"):
        assert table[name][:2] == ["builtin", "free,paid"], table[name]
    assert table["run_python"][:2] == ["builtin", "paid"]  # only where the code interpreter is
    assert table["recall_memory"][2] == "personal chats"
    assert table["calc__add"] == ["mcp:calc", "paid", "all", "yes"]
    assert table["calc__echo"] == ["mcp:calc", "paid", "all", "no: asks the user"]
    assert table["calc__crash"][3] == "no: asks the user"  # not read-only unless marked

    found = json.loads(cli(data_dir, "tools", "list", "--json", env=env).output)
    [calc] = found["servers"]
    assert calc["name"] == "calc" and calc["read_only"] == ["add"]
    unlisted = [t for t in found["tools"] if t["source"] == "mcp:calc"]
    assert unlisted == [
        {
            "name": "calc__*",
            "source": "mcp:calc",
            "tiers": ["paid"],
            "workspaces": ["all"],
            "read_only": None,
            "marked_read_only": ["add"],
        }
    ]
    audit = cli(data_dir, "audit", "list", env=env).output
    assert "mcp.read_only" in audit
