"""The serving system's migrations (audit log, moderation, data rules, summaries, replicas,
teams), registered after the first round's in `chatbox.store.migrations`."""

from __future__ import annotations

import aiosqlite

from chatbox.store.migrations import _script, migration


@migration("0005_audit_log")
async def _audit_log(conn: aiosqlite.Connection) -> None:
    # Admin actions: who (actor), what (action), on whom (target), when (at), and a JSON
    # detail that never holds content or secrets. Names are copied in, not referenced, so a
    # row outlives a renamed or deleted account. Append-only: triggers refuse UPDATE and DELETE.
    await _script(
        conn,
        """
        CREATE TABLE audit_log (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            at REAL NOT NULL,
            actor_id TEXT,
            actor_name TEXT NOT NULL,
            action TEXT NOT NULL,
            target_id TEXT,
            target_name TEXT,
            detail TEXT NOT NULL DEFAULT '{}'
        );
        CREATE INDEX audit_log_by_target ON audit_log (target_id, id);
        CREATE INDEX audit_log_by_action ON audit_log (action, id)
        """,
    )
    for trigger in _AUDIT_TRIGGERS:
        await conn.execute(trigger)


_AUDIT_TRIGGERS = (
    """CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log BEGIN
        SELECT RAISE(ABORT, 'the audit log is append-only');
    END""",
    """CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log BEGIN
        SELECT RAISE(ABORT, 'the audit log is append-only');
    END""",
)


@migration("0006_moderation")
async def _moderation(conn: aiosqlite.Connection) -> None:
    # Review items of moderation (text only where the policy keeps it), and a new turn
    # status, `filtered`: an answer cut by output moderation. SQLite cannot alter a CHECK,
    # so the constraint is widened in the schema text (a superset: every row still passes).
    await _script(
        conn,
        """
        CREATE TABLE moderation_items (
            id TEXT PRIMARY KEY,
            created_at REAL NOT NULL,
            user_id TEXT REFERENCES users(id),
            tier TEXT NOT NULL,
            direction TEXT NOT NULL,
            action TEXT NOT NULL CHECK (action IN ('warn', 'flag', 'block')),
            category TEXT NOT NULL,
            scores TEXT NOT NULL DEFAULT '{}',
            text TEXT,
            conversation_id TEXT,
            turn_id TEXT,
            source TEXT,
            status TEXT NOT NULL DEFAULT 'open'
                CHECK (status IN ('open', 'noted', 'dismissed', 'confirmed')),
            resolved_by TEXT,
            resolved_at REAL
        );
        CREATE INDEX moderation_by_status ON moderation_items (status, created_at);
        CREATE INDEX moderation_by_turn ON moderation_items (turn_id)
        """,
    )
    # A deleted conversation takes the text of its items with it (scores stay).
    await conn.execute(
        """CREATE TRIGGER moderation_forget_conversation
        AFTER UPDATE OF deleted_at ON conversations WHEN new.deleted_at IS NOT NULL BEGIN
            UPDATE moderation_items SET text = NULL WHERE conversation_id = new.id;
        END"""
    )
    async with conn.execute("PRAGMA schema_version") as cur:
        row = await cur.fetchone()
    version = int(row[0]) if row else 0
    await conn.execute("PRAGMA writable_schema = ON")
    await conn.execute(
        "UPDATE sqlite_master SET sql = replace(sql, \"'interrupted')\","
        " \"'interrupted', 'filtered')\") WHERE type = 'table' AND name = 'turns'"
    )
    await conn.execute(f"PRAGMA schema_version = {version + 1}")
    await conn.execute("PRAGMA writable_schema = OFF")


@migration("0007_data_rules")
async def _data_rules(conn: aiosqlite.Connection) -> None:
    # Erasure keeps the conversation row as a content-free tombstone (id, owner, when:
    # `erased_at`); a deleted account keeps its row as one too (usage stays counted). FTS5's
    # secure-delete removes erased words from the index itself, not only from its lookups.
    # Zero-data-retention can be asked for per account and per API key.
    await _script(
        conn,
        """
        ALTER TABLE conversations ADD COLUMN erased_at REAL;
        ALTER TABLE users ADD COLUMN deleted_at REAL;
        ALTER TABLE users ADD COLUMN zero_retention INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE api_keys ADD COLUMN zero_retention INTEGER NOT NULL DEFAULT 0;
        INSERT INTO turn_fts (turn_fts, rank) VALUES ('secure-delete', 1);
        INSERT INTO chunk_fts (chunk_fts, rank) VALUES ('secure-delete', 1)
        """,
    )
    for trigger in _ERASURE_TRIGGERS:
        await conn.execute(trigger)


_ERASURE_TRIGGERS = (
    # Append-only holds for every kept turn: only an erased conversation's turns may go.
    """CREATE TRIGGER turns_erase_only BEFORE DELETE ON turns
    WHEN (SELECT erased_at FROM conversations WHERE id = old.conversation_id) IS NULL BEGIN
        SELECT RAISE(ABORT, 'turns are append-only; only an erased conversation loses them');
    END""",
    # Nothing new lands in a deleted conversation: a late answer or a late memory extraction.
    """CREATE TRIGGER turns_not_into_deleted BEFORE INSERT ON turns
    WHEN (SELECT deleted_at FROM conversations WHERE id = new.conversation_id) IS NOT NULL
    BEGIN SELECT RAISE(ABORT, 'the conversation was deleted'); END""",
    """CREATE TRIGGER memories_not_from_deleted BEFORE INSERT ON memories
    WHEN new.conversation_id IS NOT NULL
        AND (SELECT deleted_at FROM conversations WHERE id = new.conversation_id) IS NOT NULL
    BEGIN SELECT RAISE(ABORT, 'the conversation was deleted'); END""",
)


@migration("0008_summaries")
async def _summaries(conn: aiosqlite.Connection) -> None:
    # Summaries of a long conversation's oldest turns (chatbox/store/summaries.py): append-only
    # like turns; erasing the conversation deletes its turns, which take these along.
    await _script(
        conn,
        """
        CREATE TABLE summaries (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            conversation_id TEXT NOT NULL REFERENCES conversations(id),
            covers_id TEXT NOT NULL REFERENCES turns(id) ON DELETE CASCADE,
            covered INTEGER NOT NULL,
            content TEXT NOT NULL,
            model TEXT,
            created_at REAL NOT NULL
        );
        CREATE INDEX summaries_by_conversation ON summaries (conversation_id, seq)
        """,
    )
    await conn.execute(
        """CREATE TRIGGER summaries_append_only BEFORE UPDATE ON summaries
        BEGIN SELECT RAISE(ABORT, 'summaries are append-only'); END"""
    )
    await conn.execute(
        """CREATE TRIGGER summaries_erase_only BEFORE DELETE ON summaries
        WHEN (SELECT erased_at FROM conversations WHERE id = old.conversation_id) IS NULL
        BEGIN SELECT RAISE(ABORT, 'summaries go only with an erased conversation'); END"""
    )


@migration("0009_replicas")
async def _replicas(conn: aiosqlite.Connection) -> None:
    # Router mode's remote engines (chatbox/cluster). Live health and load stay in the front;
    # only what an operator configured is kept. `secret` is the replica's bearer token where
    # it differs from the shared CHATBOX_REPLICA_TOKEN (an OpenAI server's API key).
    await _script(
        conn,
        """
        CREATE TABLE replicas (
            url TEXT PRIMARY KEY,
            kind TEXT NOT NULL DEFAULT 'chatbox',
            slots INTEGER NOT NULL DEFAULT 0,
            models TEXT NOT NULL DEFAULT '',
            secret TEXT,
            draining INTEGER NOT NULL DEFAULT 0,
            added_at REAL NOT NULL
        )
        """,
    )


@migration("0010_teams")
async def _teams(conn: aiosqlite.Connection) -> None:
    # Share links: a snapshot's text is copied in (later edits or erasure of the conversation
    # leave it as shared); only the token's hash is kept. Workspaces: a conversation or a
    # document may belong to one, and each turn records who wrote it.
    await _script(
        conn,
        """
        CREATE TABLE shares (
            id TEXT PRIMARY KEY,
            token_hash TEXT NOT NULL UNIQUE,
            user_id TEXT NOT NULL REFERENCES users(id),
            conversation_id TEXT NOT NULL,
            title TEXT,
            upto_turn_id TEXT NOT NULL,
            turns INTEGER NOT NULL,
            created_at REAL NOT NULL
        );
        CREATE INDEX shares_by_user ON shares (user_id, conversation_id);
        CREATE TABLE share_turns (
            share_id TEXT NOT NULL REFERENCES shares(id) ON DELETE CASCADE,
            ord INTEGER NOT NULL,
            role TEXT NOT NULL,
            content TEXT NOT NULL,
            model TEXT,
            PRIMARY KEY (share_id, ord)
        );
        CREATE TABLE share_passages (
            share_id TEXT NOT NULL REFERENCES shares(id) ON DELETE CASCADE,
            turn_ord INTEGER NOT NULL,
            ord INTEGER NOT NULL,
            document TEXT NOT NULL,
            page INTEGER,
            text TEXT NOT NULL,
            PRIMARY KEY (share_id, turn_ord, ord)
        );
        CREATE TABLE workspaces (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            system_prompt TEXT,
            created_at REAL NOT NULL
        );
        CREATE TABLE workspace_members (
            workspace_id TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
            user_id TEXT NOT NULL REFERENCES users(id),
            role TEXT NOT NULL CHECK (role IN ('owner', 'member')),
            added_at REAL NOT NULL,
            PRIMARY KEY (workspace_id, user_id)
        );
        CREATE INDEX workspace_members_by_user ON workspace_members (user_id);
        ALTER TABLE conversations ADD COLUMN workspace_id TEXT;
        ALTER TABLE turns ADD COLUMN author_id TEXT;
        ALTER TABLE documents ADD COLUMN workspace_id TEXT;
        CREATE INDEX conversations_by_workspace ON conversations (workspace_id, deleted_at)
        """,
    )


@migration("0011_import_staging")
async def _import_staging(conn: aiosqlite.Connection) -> None:
    # An import is written in short transactions, hidden (deleted_at set, importing = 1) until
    # all of it is in; a crash leaves it hidden, and the sweeper erases it as a deletion.
    # Retention counts an imported conversation from `imported_at` as well as its last turn.
    await _script(
        conn,
        """
        ALTER TABLE conversations ADD COLUMN imported_at REAL;
        ALTER TABLE conversations ADD COLUMN importing INTEGER NOT NULL DEFAULT 0;
        DROP TRIGGER turns_not_into_deleted
        """,
    )
    await conn.execute(
        """CREATE TRIGGER turns_not_into_deleted BEFORE INSERT ON turns
        WHEN (SELECT deleted_at IS NOT NULL AND (importing = 0 OR erased_at IS NOT NULL)
              FROM conversations WHERE id = new.conversation_id)
        BEGIN SELECT RAISE(ABORT, 'the conversation was deleted'); END"""
    )


@migration("0012_audit_refuses_replace")
async def _audit_refuses_replace(conn: aiosqlite.Connection) -> None:
    # `INSERT OR REPLACE` deletes the row it collides with without firing the delete trigger
    # (recursive triggers are off), so an insert onto a taken id is refused before it runs.
    await conn.execute(
        """CREATE TRIGGER audit_log_no_replace BEFORE INSERT ON audit_log
        WHEN EXISTS (SELECT 1 FROM audit_log WHERE id = new.id) BEGIN
            SELECT RAISE(ABORT, 'the audit log is append-only');
        END"""
    )


@migration("0013_feedback")
async def _feedback(conn: aiosqlite.Connection) -> None:
    # A rating is never changed in place: each change is a new row, and the newest row of a
    # (turn, person) is the one that counts; erasure deletes rows (no tombstone is needed).
    await _script(
        conn,
        """
        CREATE TABLE feedback (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            turn_id TEXT NOT NULL REFERENCES turns(id),
            conversation_id TEXT NOT NULL REFERENCES conversations(id),
            user_id TEXT NOT NULL REFERENCES users(id),
            rating TEXT NOT NULL CHECK (rating IN ('up', 'down')),
            comment TEXT,
            model TEXT,
            arm TEXT,
            tier TEXT NOT NULL,
            created_at REAL NOT NULL
        );
        CREATE INDEX feedback_by_turn ON feedback (turn_id, user_id, seq);
        CREATE INDEX feedback_by_conversation ON feedback (conversation_id);
        CREATE INDEX feedback_by_user ON feedback (user_id)
        """,
    )
    await conn.execute(
        """CREATE TRIGGER feedback_append_only BEFORE UPDATE ON feedback
        BEGIN SELECT RAISE(ABORT, 'feedback is append-only'); END"""
    )
