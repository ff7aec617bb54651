"""Cached tool results: one row per (scope, tool, version, arguments), keyed by their hash.

A result is content (declared in `chatbox.store.content`): erased with the conversation
whose call made it (a pure tool's too, though the user's other conversations find it by its
key), by retention and with its user. Nothing is written under zero-data-retention: the chat
layer asks before `put`.
"""

from __future__ import annotations

import time

from chatbox.store.db import Database


class ToolResultRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def get(self, key: str, user_id: str) -> str | None:
        """The cached result (JSON text) under key, if this user's."""
        row = await self.db.fetchone(
            "SELECT result FROM tool_results WHERE key = ? AND user_id = ?", (key, user_id)
        )
        return str(row["result"]) if row else None

    async def put(
        self, key: str, user_id: str, conversation_id: str, tool: str, result: str
    ) -> None:
        async with self.db.transaction() as tx:
            # A conversation erased meanwhile caches nothing more.
            async with tx.execute(
                "SELECT 1 FROM conversations WHERE id = ? AND deleted_at IS NULL",
                (conversation_id,),
            ) as cur:
                if await cur.fetchone() is None:
                    return
            await tx.execute(
                "INSERT INTO tool_results (key, user_id, conversation_id, tool, result,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET"
                " user_id = excluded.user_id, conversation_id = excluded.conversation_id,"
                " tool = excluded.tool, result = excluded.result,"
                " created_at = excluded.created_at",
                (key, user_id, conversation_id, tool, result, time.time()),
            )

    async def count(self, user_id: str) -> int:
        row = await self.db.fetchone(
            "SELECT count(*) AS n FROM tool_results WHERE user_id = ?", (user_id,)
        )
        return int(row["n"]) if row else 0
