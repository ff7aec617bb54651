"""The audit log of admin actions: append and read, nothing else.

Rows are never updated or deleted: this repository offers no way to, and triggers on the table
(migration 0005_audit_log) refuse UPDATE and DELETE from anywhere else too.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from chatbox.store.db import Database

MAX_LIST = 10_000


@dataclass(frozen=True)
class AuditEntry:
    id: int
    at: float
    actor_id: str | None  # None for the CLI and the system (no logged-in account)
    actor_name: str
    action: str
    target_id: str | None
    target_name: str | None
    detail: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: Any) -> AuditEntry:
        return cls(
            row["id"],
            row["at"],
            row["actor_id"],
            row["actor_name"],
            row["action"],
            row["target_id"],
            row["target_name"],
            json.loads(row["detail"] or "{}"),
        )


class AuditRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def append(
        self,
        *,
        actor_id: str | None,
        actor_name: str,
        action: str,
        target_id: str | None = None,
        target_name: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> AuditEntry:
        body = json.dumps(detail or {}, sort_keys=True, separators=(",", ":"))
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "INSERT INTO audit_log (at, actor_id, actor_name, action, target_id,"
                " target_name, detail) VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (time.time(), actor_id, actor_name, action, target_id, target_name, body),
            )
            entry_id = int((await cur.fetchone())[0])
        row = await self.db.fetchone("SELECT * FROM audit_log WHERE id = ?", (entry_id,))
        return AuditEntry.from_row(row)

    async def list(
        self,
        limit: int = 50,
        *,
        target_id: str | None = None,
        action: str | None = None,
        before_id: int | None = None,
    ) -> list[AuditEntry]:
        """The newest entries first, optionally only those on one user or of one action."""
        where: list[str] = []
        params: list[str | int] = []
        if target_id is not None:
            where.append("target_id = ?")
            params.append(target_id)
        if action is not None:
            where.append("action = ?")
            params.append(action)
        if before_id is not None:
            where.append("id < ?")
            params.append(before_id)
        sql = "SELECT * FROM audit_log"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT ?"
        rows = await self.db.fetchall(sql, (*params, max(0, min(limit, MAX_LIST))))
        return [AuditEntry.from_row(r) for r in rows]
