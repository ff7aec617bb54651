"""Named, ordered schema migrations (the first round's), each recorded once applied.

Later rounds add theirs in their own modules; `chatbox.store.migrate` applies them all.
"""

from __future__ import annotations

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


@migration("0003_knowledge")
async def _knowledge(conn: aiosqlite.Connection) -> None:
    # Vectors: all-MiniLM-L6-v2, 384-d, unit length, so L2 order is cosine order.
    # Each vec0 table is partitioned by user: a KNN query only ever scans one user's rows.
    await _script(
        conn,
        """
        ALTER TABLE users ADD COLUMN memory_enabled INTEGER NOT NULL DEFAULT 1;
        CREATE TABLE memories (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            user_id TEXT NOT NULL REFERENCES users(id),
            text TEXT NOT NULL,
            source TEXT NOT NULL DEFAULT 'explicit' CHECK (source IN ('explicit', 'extracted')),
            conversation_id TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        );
        CREATE INDEX memories_by_user ON memories (user_id, updated_at);
        CREATE VIRTUAL TABLE memory_vec USING vec0(
            user_id text partition key, embedding float[384]
        );
        CREATE TABLE memory_extractions (
            conversation_id TEXT PRIMARY KEY REFERENCES conversations(id),
            last_seq INTEGER NOT NULL,
            extracted_at REAL NOT NULL
        );
        CREATE TABLE documents (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            user_id TEXT NOT NULL REFERENCES users(id),
            conversation_id TEXT REFERENCES conversations(id),
            name TEXT NOT NULL,
            mime TEXT NOT NULL,
            size_bytes INTEGER NOT NULL,
            pages INTEGER,
            chars INTEGER NOT NULL,
            created_at REAL NOT NULL
        );
        CREATE INDEX documents_by_user ON documents (user_id, conversation_id);
        CREATE TABLE chunks (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            document_id TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
            user_id TEXT NOT NULL,
            ord INTEGER NOT NULL,
            page INTEGER,
            start_char INTEGER NOT NULL,
            text TEXT NOT NULL
        );
        CREATE INDEX chunks_by_document ON chunks (document_id, ord);
        CREATE VIRTUAL TABLE chunk_vec USING vec0(
            user_id text partition key, embedding float[384]
        );
        CREATE VIRTUAL TABLE chunk_fts USING fts5(
            text, content='chunks', content_rowid='seq', tokenize='porter unicode61'
        );
        CREATE TABLE turn_citations (
            turn_id TEXT NOT NULL REFERENCES turns(id),
            chunk_seq INTEGER NOT NULL REFERENCES chunks(seq) ON DELETE CASCADE,
            ord INTEGER NOT NULL,
            score REAL NOT NULL,
            PRIMARY KEY (turn_id, chunk_seq)
        );
        CREATE INDEX turn_citations_by_chunk ON turn_citations (chunk_seq);
        CREATE VIRTUAL TABLE turn_fts USING fts5(
            content, content='turns', content_rowid='seq', tokenize='porter unicode61'
        );
        INSERT INTO turn_fts (turn_fts) VALUES ('rebuild');
        CREATE VIRTUAL TABLE turn_vec USING vec0(
            user_id text partition key, embedding float[384]
        );
        CREATE TABLE turn_vec_progress (
            user_id TEXT PRIMARY KEY REFERENCES users(id),
            last_seq INTEGER NOT NULL
        )
        """,
    )
    # Trigger bodies hold semicolons, so they are not split like the script above.
    for trigger in _KNOWLEDGE_TRIGGERS:
        await conn.execute(trigger)


_KNOWLEDGE_TRIGGERS = (
    """CREATE TRIGGER chunks_fts_insert AFTER INSERT ON chunks BEGIN
        INSERT INTO chunk_fts (rowid, text) VALUES (new.seq, new.text);
    END""",
    """CREATE TRIGGER chunks_fts_delete AFTER DELETE ON chunks BEGIN
        INSERT INTO chunk_fts (chunk_fts, rowid, text) VALUES ('delete', old.seq, old.text);
        DELETE FROM chunk_vec WHERE rowid = old.seq;
    END""",
    """CREATE TRIGGER turns_fts_insert AFTER INSERT ON turns BEGIN
        INSERT INTO turn_fts (rowid, content) VALUES (new.seq, new.content);
    END""",
)


@migration("0004_turn_routing")
async def _turn_routing(conn: aiosqlite.Connection) -> None:
    # How each answer's model was chosen, kept with it so canary arms can be compared and a
    # degraded answer still says so after a reload.
    for table in ("turns", "drafts"):
        for column in ("route", "arm", "degraded_from"):
            await conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} TEXT")
