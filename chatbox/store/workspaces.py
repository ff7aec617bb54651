"""Workspaces: a named group of users (owner, member) whose conversations all of them see.

Who may see a conversation is decided in one place, `chatbox.store.visibility.visible_to`:
its own user's while it is in no workspace, every current member's while it is in one.
"""

from __future__ import annotations

import builtins
import time
from dataclasses import dataclass
from typing import Any, Literal

from chatbox.store.db import Database, also_for
from chatbox.store.records import new_id

WorkspaceRole = Literal["owner", "member"]


@dataclass(frozen=True)
class Workspace:
    id: str
    name: str
    system_prompt: str | None
    created_at: float

    @classmethod
    def from_row(cls, row: Any) -> Workspace:
        return cls(row["id"], row["name"], row["system_prompt"], row["created_at"])


@dataclass(frozen=True)
class Member:
    user_id: str
    name: str
    role: WorkspaceRole
    added_at: float


class WorkspaceRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def create(self, name: str, system_prompt: str | None = None) -> Workspace:
        ws_id = new_id("w")
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO workspaces (id, name, system_prompt, created_at) VALUES (?, ?, ?, ?)",
                (ws_id, name, system_prompt, time.time()),
            )
        ws = await self.get(ws_id)
        assert ws is not None
        return ws

    async def get(self, ws_id: str) -> Workspace | None:
        row = await self.db.fetchone(
            "SELECT * FROM workspaces WHERE id = ? OR name = ?", (ws_id, ws_id)
        )
        return Workspace.from_row(row) if row else None

    async def list(self, user_id: str | None = None) -> builtins.list[Workspace]:
        """Every workspace (user_id None), or those the user belongs to."""
        if user_id is None:
            rows = await self.db.fetchall("SELECT * FROM workspaces ORDER BY name")
        else:
            rows = await self.db.fetchall(
                "SELECT w.* FROM workspaces w JOIN workspace_members m ON m.workspace_id = w.id"
                " WHERE m.user_id = ? ORDER BY w.name",
                (user_id,),
            )
        return [Workspace.from_row(r) for r in rows]

    async def role(self, ws_id: str, user_id: str) -> WorkspaceRole | None:
        row = await self.db.fetchone(
            "SELECT role FROM workspace_members WHERE workspace_id = ? AND user_id = ?",
            (ws_id, user_id),
        )
        return row["role"] if row else None

    async def members(self, ws_id: str) -> builtins.list[Member]:
        rows = await self.db.fetchall(
            "SELECT m.user_id, u.name, m.role, m.added_at FROM workspace_members m"
            " JOIN users u ON u.id = m.user_id WHERE m.workspace_id = ? ORDER BY m.role DESC,"
            " u.name",
            (ws_id,),
        )
        return [Member(r["user_id"], r["name"], r["role"], r["added_at"]) for r in rows]

    async def set_member(self, ws_id: str, user_id: str, role: WorkspaceRole) -> None:
        """Add the user (or change their role)."""
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO workspace_members (workspace_id, user_id, role, added_at)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (workspace_id, user_id)"
                " DO UPDATE SET role = excluded.role",
                (ws_id, user_id, role, time.time()),
            )

    async def remove_member(self, ws_id: str, user_id: str) -> bool:
        async with self.db.transaction() as tx:
            also_for(user_id)  # a replica serves them only once it holds their removal
            cur = await tx.execute(
                "DELETE FROM workspace_members WHERE workspace_id = ? AND user_id = ?",
                (ws_id, user_id),
            )
        return bool(cur.rowcount > 0)

    async def set_system_prompt(self, ws_id: str, system_prompt: str | None) -> None:
        async with self.db.transaction() as tx:
            await tx.execute(
                "UPDATE workspaces SET system_prompt = ? WHERE id = ?", (system_prompt, ws_id)
            )

    async def move(self, user_id: str, conv_id: str, ws_id: str | None) -> bool:
        """Move the user's own conversation into a workspace (or back out: ws_id None)."""
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "UPDATE conversations SET workspace_id = ? WHERE id = ? AND user_id = ?"
                " AND deleted_at IS NULL",
                (ws_id, conv_id, user_id),
            )
        return bool(cur.rowcount > 0)

    async def contents(
        self, ws_id: str
    ) -> tuple[builtins.list[tuple[str, str]], builtins.list[tuple[str, str]]]:
        """(owner id, conversation id) of its conversations, and (owner, id) of its documents."""
        convs = await self.db.fetchall(
            "SELECT user_id, id FROM conversations WHERE workspace_id = ? AND erased_at IS NULL",
            (ws_id,),
        )
        docs = await self.db.fetchall(
            "SELECT user_id, id FROM documents WHERE workspace_id = ?", (ws_id,)
        )
        return [(r["user_id"], r["id"]) for r in convs], [(r["user_id"], r["id"]) for r in docs]
