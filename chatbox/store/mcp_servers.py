"""The MCP servers admins configured: how each is reached and where its tools are offered."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from chatbox.store.db import Database


@dataclass(frozen=True)
class McpServerRow:
    name: str
    transport: str  # stdio | http
    command: str  # stdio: the command line (split as a shell would)
    url: str  # http: the streamable-HTTP endpoint
    env: dict[str, str]  # stdio: extra environment variables (may hold secrets)
    headers: dict[str, str]  # http: extra request headers (may hold secrets)
    tiers: tuple[str, ...]  # empty: every tier
    workspaces: tuple[str, ...]  # workspace ids; empty: everywhere
    added_at: float
    read_only: tuple[str, ...] = ()  # the server's names of its tools marked read-only

    def is_read_only(self, tool: str) -> bool:
        return tool in self.read_only

    @classmethod
    def from_row(cls, row: Any) -> McpServerRow:
        return cls(
            row["name"],
            row["transport"],
            row["command"],
            row["url"],
            dict(json.loads(row["env"])),
            dict(json.loads(row["headers"])),
            tuple(t for t in str(row["tiers"]).split(",") if t),
            tuple(w for w in str(row["workspaces"]).split(",") if w),
            float(row["added_at"]),
            tuple(json.loads(row["read_only"])),
        )


class McpServerRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def list(self) -> list[McpServerRow]:
        rows = await self.db.fetchall("SELECT * FROM mcp_servers ORDER BY name")
        return [McpServerRow.from_row(r) for r in rows]

    async def get(self, name: str) -> McpServerRow | None:
        row = await self.db.fetchone("SELECT * FROM mcp_servers WHERE name = ?", (name,))
        return None if row is None else McpServerRow.from_row(row)

    async def put(
        self,
        name: str,
        transport: str,
        *,
        command: str = "",
        url: str = "",
        env: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        tiers: tuple[str, ...] = (),
        workspaces: tuple[str, ...] = (),
    ) -> McpServerRow:
        """Add a server, or replace how one is reached and where it is offered."""
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO mcp_servers (name, transport, command, url, env, headers, tiers,"
                " workspaces, added_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT(name) DO UPDATE SET transport = excluded.transport,"
                " command = excluded.command, url = excluded.url, env = excluded.env,"
                " headers = excluded.headers, tiers = excluded.tiers,"
                " workspaces = excluded.workspaces",
                (
                    name,
                    transport,
                    command,
                    url,
                    json.dumps(env or {}),
                    json.dumps(headers or {}),
                    ",".join(tiers),
                    ",".join(workspaces),
                    time.time(),
                ),
            )
        row = await self.get(name)
        assert row is not None
        return row

    async def set_read_only(self, name: str, tools: tuple[str, ...]) -> McpServerRow | None:
        """Set which of a server's tools are read-only; None if there is no such server."""
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "UPDATE mcp_servers SET read_only = ? WHERE name = ?",
                (json.dumps(sorted(set(tools))), name),
            )
            if not cur.rowcount:
                return None
        return await self.get(name)

    async def remove(self, name: str) -> bool:
        async with self.db.transaction() as tx:
            cur = await tx.execute("DELETE FROM mcp_servers WHERE name = ?", (name,))
            return bool(cur.rowcount)
