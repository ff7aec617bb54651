"""Named, ordered schema migrations, each recorded in the `migrations` table once applied."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import aiosqlite

Migration = Callable[[aiosqlite.Connection], Awaitable[None]]
MIGRATIONS: list[tuple[str, Migration]] = []


def migration(name: str) -> Callable[[Migration], Migration]:
    """Register a migration; order of definition is the order of application."""

    def register(fn: Migration) -> Migration:
        MIGRATIONS.append((name, fn))
        return fn

    return register


async def _script(conn: aiosqlite.Connection, sql: str) -> None:
    # executescript would COMMIT the surrounding transaction, so run statements one by one.
    for statement in sql.split(";\n"):
        if statement.strip():
            await conn.execute(statement)


@migration("0001_initial")
async def _initial(conn: aiosqlite.Connection) -> None:
    await _script(
        conn,
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta (key, value) VALUES ('schema', 'chatbox');
        CREATE TABLE users (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            role TEXT NOT NULL DEFAULT 'member' CHECK (role IN ('admin', 'member')),
            tier TEXT NOT NULL DEFAULT 'free',
            password_hash TEXT,
            disabled INTEGER NOT NULL DEFAULT 0,
            created_at REAL NOT NULL
        );
        CREATE TABLE conversations (
            id TEXT PRIMARY KEY,
            user_id TEXT NOT NULL REFERENCES users(id),
            title TEXT,
            system_prompt TEXT,
            model TEXT,
            active_leaf_id TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            deleted_at REAL
        );
        CREATE INDEX conversations_by_user ON conversations (user_id, deleted_at, updated_at);
        CREATE TABLE turns (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            conversation_id TEXT NOT NULL REFERENCES conversations(id),
            parent_id TEXT REFERENCES turns(id),
            role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
            content TEXT NOT NULL,
            status TEXT NOT NULL
                CHECK (status IN ('complete', 'stopped', 'failed', 'interrupted')),
            model TEXT,
            prompt_tokens INTEGER NOT NULL DEFAULT 0,
            completion_tokens INTEGER NOT NULL DEFAULT 0,
            cached_tokens INTEGER NOT NULL DEFAULT 0,
            error TEXT,
            created_at REAL NOT NULL
        );
        CREATE INDEX turns_by_parent ON turns (conversation_id, parent_id, seq);
        CREATE TRIGGER turns_append_only BEFORE UPDATE ON turns
        BEGIN SELECT RAISE(ABORT, 'turns are append-only'); END;
        CREATE TABLE drafts (
            id TEXT PRIMARY KEY,
            conversation_id TEXT NOT NULL REFERENCES conversations(id),
            parent_id TEXT NOT NULL REFERENCES turns(id),
            model TEXT,
            content TEXT NOT NULL DEFAULT '',
            started_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )
        """,
    )


@migration("0002_accounts")
async def _accounts(conn: aiosqlite.Connection) -> None:
    await _script(
        conn,
        """
        CREATE TABLE api_keys (
            id TEXT PRIMARY KEY,
            user_id TEXT NOT NULL REFERENCES users(id),
            name TEXT,
            prefix TEXT NOT NULL,
            key_hash TEXT NOT NULL UNIQUE,
            created_at REAL NOT NULL,
            last_used_at REAL,
            revoked_at REAL
        );
        CREATE INDEX api_keys_by_user ON api_keys (user_id);
        CREATE TABLE sessions (
            token_hash TEXT PRIMARY KEY,
            user_id TEXT NOT NULL REFERENCES users(id),
            csrf_token TEXT NOT NULL,
            created_at REAL NOT NULL,
            expires_at REAL NOT NULL
        );
        CREATE INDEX sessions_by_user ON sessions (user_id);
        CREATE TABLE usage (
            user_id TEXT NOT NULL REFERENCES users(id),
            model TEXT NOT NULL,
            day TEXT NOT NULL,
            arm TEXT NOT NULL DEFAULT '',
            requests INTEGER NOT NULL DEFAULT 0,
            prompt_tokens INTEGER NOT NULL DEFAULT 0,
            completion_tokens INTEGER NOT NULL DEFAULT 0,
            cached_tokens INTEGER NOT NULL DEFAULT 0,
            shed INTEGER NOT NULL DEFAULT 0,
            degraded INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (user_id, model, day, arm)
        );
        CREATE INDEX usage_by_day ON usage (day)
        """,
    )


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
