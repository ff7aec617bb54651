"""Apply the schema migrations of every round, in order, each once."""

from __future__ import annotations

import time

import aiosqlite

from chatbox.store import migrations_serving  # noqa: F401  (registers its migrations)
from chatbox.store.migrations import MIGRATIONS

__all__ = ["MIGRATIONS", "apply_migrations"]


async def apply_migrations(conn: aiosqlite.Connection) -> list[str]:
    """Apply every migration not yet recorded; returns the names applied now."""
    await conn.execute(
        "CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)"
    )
    async with conn.execute("SELECT name FROM migrations") as cur:
        done = {row[0] for row in await cur.fetchall()}
    applied = []
    for name, fn in MIGRATIONS:
        if name in done:
            continue
        await fn(conn)
        await conn.execute(
            "INSERT INTO migrations (name, applied_at) VALUES (?, ?)", (name, time.time())
        )
        applied.append(name)
    return applied
