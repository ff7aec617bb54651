"""The schema's migrations: one ordered list of named steps, each applied once and recorded.

The names are what a database records in its `migrations` table, so a step keeps its name
for good; a new step goes at the end of `MIGRATIONS`, with its PostgreSQL script under the
same name in `POSTGRESQL` (chatbox/store/pg_migrations.py: the same tables and columns;
types, triggers, full-text search and vectors in PostgreSQL's own terms).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import aiosqlite

Migration = Callable[[aiosqlite.Connection], Awaitable[None]]


async def _script(conn: aiosqlite.Connection, sql: str) -> None:
    # executescript would COMMIT the surrounding transaction, so run statements one by one.
    for statement in sql.split(";\n"):
        if statement.strip():
            await conn.execute(statement)


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


async def _turn_routing(conn: aiosqlite.Connection) -> None:
    # How each answer's model was chosen, kept with it so canary arms can be compared and a
    # degraded answer still says so after a reload.
    for table in ("turns", "drafts"):
        for column in ("route", "arm", "degraded_from"):
            await conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} TEXT")


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


async def _audit_refuses_replace(conn: aiosqlite.Connection) -> None:
    # `INSERT OR REPLACE` deletes the row it collides with without firing the delete trigger
    # (recursive triggers are off), so an insert onto a taken id is refused before it runs.
    await conn.execute(
        """CREATE TRIGGER audit_log_no_replace BEFORE INSERT ON audit_log
        WHEN EXISTS (SELECT 1 FROM audit_log WHERE id = new.id) BEGIN
            SELECT RAISE(ABORT, 'the audit log is append-only');
        END"""
    )


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


async def _mcp_servers(conn: aiosqlite.Connection) -> None:
    # The MCP servers admins added (chatbox/chat/tools/mcp_servers.py): a command or a URL, with its
    # environment or headers (they may hold secrets, never shown back), and where it is offered.
    await _script(
        conn,
        """
        CREATE TABLE mcp_servers (
            name TEXT PRIMARY KEY,
            transport TEXT NOT NULL CHECK (transport IN ('stdio', 'http')),
            command TEXT NOT NULL DEFAULT '',
            url TEXT NOT NULL DEFAULT '',
            env TEXT NOT NULL DEFAULT '{}',
            headers TEXT NOT NULL DEFAULT '{}',
            tiers TEXT NOT NULL DEFAULT '',
            workspaces TEXT NOT NULL DEFAULT '',
            added_at REAL NOT NULL
        )
        """,
    )


async def _usage_by_hour(conn: aiosqlite.Connection) -> None:
    # Requests per model and hour, no person: pre-warming learns each model's week from it.
    await _script(
        conn,
        """
        CREATE TABLE usage_hours (
            model TEXT NOT NULL,
            hour INTEGER NOT NULL,
            requests INTEGER NOT NULL DEFAULT 0,
            tokens INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (model, hour)
        );
        CREATE INDEX usage_hours_by_hour ON usage_hours (hour)
        """,
    )


async def _evals_and_canary_verdicts(conn: aiosqlite.Connection) -> None:
    # Eval runs are the admin's suites and the models' answers to them, never a person's
    # content; canary events are append-only (the newest of an arm is its state) and each
    # arm's latest verdict is one row the server rewrites (the CLI reads it).
    await _script(
        conn,
        """
        CREATE TABLE eval_runs (
            id TEXT PRIMARY KEY,
            model TEXT NOT NULL,
            suite TEXT NOT NULL,
            suite_digest TEXT NOT NULL,
            judge TEXT,
            actor_name TEXT NOT NULL,
            started_at REAL NOT NULL,
            finished_at REAL,
            cases INTEGER NOT NULL DEFAULT 0,
            passed INTEGER NOT NULL DEFAULT 0,
            score REAL
        );
        CREATE INDEX eval_runs_by_model ON eval_runs (model, started_at);
        CREATE TABLE eval_results (
            run_id TEXT NOT NULL REFERENCES eval_runs(id),
            case_id TEXT NOT NULL,
            category TEXT NOT NULL,
            check_kind TEXT NOT NULL,
            passed INTEGER NOT NULL,
            score REAL NOT NULL,
            latency_s REAL NOT NULL,
            answer TEXT NOT NULL,
            detail TEXT NOT NULL,
            PRIMARY KEY (run_id, case_id)
        );
        CREATE TABLE canary_events (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            arm TEXT NOT NULL,
            tier TEXT NOT NULL,
            model TEXT NOT NULL,
            action TEXT NOT NULL CHECK (action IN ('promote', 'rollback', 'hold', 'resume')),
            automatic INTEGER NOT NULL DEFAULT 0,
            reason TEXT NOT NULL,
            actor_name TEXT NOT NULL,
            at REAL NOT NULL
        );
        CREATE INDEX canary_events_by_arm ON canary_events (arm, seq);
        CREATE TABLE canary_verdicts (
            arm TEXT PRIMARY KEY,
            tier TEXT NOT NULL,
            model TEXT NOT NULL,
            verdict TEXT NOT NULL,
            reason TEXT NOT NULL,
            detail TEXT NOT NULL,
            at REAL NOT NULL
        )
        """,
    )
    await conn.execute(
        """CREATE TRIGGER canary_events_append_only BEFORE UPDATE ON canary_events
        BEGIN SELECT RAISE(ABORT, 'canary events are append-only'); END"""
    )


async def _tool_turns(conn: aiosqlite.Connection) -> None:
    # A tool call and its result are turns of their own (role tool_call, tool_result); tool
    # results are cached per conversation, or per user for a pure tool.
    async with conn.execute("PRAGMA schema_version") as cur:
        row = await cur.fetchone()
    version = int(row[0]) if row else 0
    await conn.execute("PRAGMA writable_schema = ON")
    await conn.execute(
        "UPDATE sqlite_master SET sql = replace(sql, \"CHECK (role IN ('user', 'assistant'))\","
        " \"CHECK (role IN ('user', 'assistant', 'tool_call', 'tool_result'))\")"
        " WHERE type = 'table' AND name = 'turns'"
    )
    await conn.execute(f"PRAGMA schema_version = {version + 1}")
    await conn.execute("PRAGMA writable_schema = OFF")
    await _script(
        conn,
        """
        CREATE TABLE tool_results (
            key TEXT PRIMARY KEY,
            user_id TEXT NOT NULL,
            conversation_id TEXT,
            tool TEXT NOT NULL,
            result TEXT NOT NULL,
            created_at REAL NOT NULL
        );
        CREATE INDEX tool_results_by_user ON tool_results (user_id);
        CREATE INDEX tool_results_by_conversation ON tool_results (conversation_id)
        """,
    )


async def _draft_front(conn: aiosqlite.Connection) -> None:
    # Which front writes each answer, so fronts sharing a database recover only dead ones'.
    await conn.execute("ALTER TABLE drafts ADD COLUMN front TEXT")


async def _shared_limits(conn: aiosqlite.Connection) -> None:
    # Limits' counters and job claims; on SQLite (one front) they stay in the process and
    # these tables stay empty, so both stores have the same tables.
    await _script(
        conn,
        """
        CREATE TABLE limit_buckets (
            key TEXT PRIMARY KEY,
            level REAL NOT NULL,
            updated REAL NOT NULL
        );
        CREATE TABLE limit_leases (
            id TEXT PRIMARY KEY,
            key TEXT NOT NULL,
            front TEXT NOT NULL,
            expires_at REAL NOT NULL
        );
        CREATE INDEX limit_leases_by_key ON limit_leases (key, expires_at);
        CREATE INDEX limit_leases_by_front ON limit_leases (front);
        CREATE TABLE limit_failures (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            counter TEXT NOT NULL,
            key TEXT NOT NULL,
            at REAL NOT NULL
        );
        CREATE INDEX limit_failures_by_key ON limit_failures (counter, key, at);
        CREATE TABLE job_claims (name TEXT PRIMARY KEY, front TEXT NOT NULL, until REAL NOT NULL)
        """,
    )


async def _shared_fleet(conn: aiosqlite.Connection) -> None:
    # Router mode over several fronts: a drain is kept per replica URL (flag replicas
    # included), where each routed key went off its hash order, and the answers each front
    # has on each OpenAI-kind replica (which reports no load of its own).
    await _script(
        conn,
        """
        CREATE TABLE replica_drains (url TEXT PRIMARY KEY, at REAL NOT NULL);
        INSERT INTO replica_drains (url, at) SELECT url, added_at FROM replicas WHERE draining = 1;
        ALTER TABLE replicas DROP COLUMN draining;
        CREATE TABLE replica_placements (key TEXT PRIMARY KEY, url TEXT NOT NULL, at REAL NOT NULL);
        CREATE INDEX replica_placements_by_age ON replica_placements (at);
        CREATE TABLE replica_loads (
            front TEXT NOT NULL,
            url TEXT NOT NULL,
            model TEXT NOT NULL,
            answers INTEGER NOT NULL,
            at REAL NOT NULL,
            PRIMARY KEY (front, url, model)
        )
        """,
    )


async def _responses(conn: aiosqlite.Connection) -> None:
    # The Responses API's stored answers, for previous_response_id and GET by id.
    await _script(
        conn,
        """
        CREATE TABLE responses (
            id TEXT PRIMARY KEY,
            user_id TEXT NOT NULL,
            model TEXT NOT NULL,
            input TEXT NOT NULL,
            output TEXT NOT NULL,
            created_at REAL NOT NULL
        );
        CREATE INDEX responses_by_user ON responses (user_id, created_at)
        """,
    )


async def _identities(conn: aiosqlite.Connection) -> None:
    # Accounts made by signing in through an identity provider or an auth proxy: the
    # provider's (issuer, subject) names one account for good; and the sign-ins sent to the
    # provider, each taken once by its callback (by its state's hash) or expired.
    await _script(
        conn,
        """
        CREATE TABLE identities (
            issuer TEXT NOT NULL,
            subject TEXT NOT NULL,
            user_id TEXT NOT NULL REFERENCES users(id),
            email TEXT,
            full_name TEXT,
            group_names TEXT NOT NULL DEFAULT '[]',
            csrf_token TEXT NOT NULL,
            provider_disabled INTEGER NOT NULL DEFAULT 0,
            created_at REAL NOT NULL,
            last_sign_in_at REAL NOT NULL,
            PRIMARY KEY (issuer, subject)
        );
        CREATE INDEX identities_by_user ON identities (user_id);
        CREATE TABLE sign_in_starts (
            state_hash TEXT PRIMARY KEY,
            browser_hash TEXT NOT NULL,
            nonce TEXT NOT NULL,
            code_verifier TEXT NOT NULL,
            redirect_uri TEXT NOT NULL,
            next TEXT NOT NULL,
            expires_at REAL NOT NULL
        )
        """,
    )


async def _password_reset_notice(conn: aiosqlite.Connection) -> None:
    # When an admin last set a person's password, until the person is told at their next login.
    await conn.execute("ALTER TABLE users ADD COLUMN password_reset_at REAL")


async def _mcp_read_only(conn: aiosqlite.Connection) -> None:
    # Which of an MCP server's tools an admin marked read-only: the others wait for the
    # user's approval before each call.
    await conn.execute("ALTER TABLE mcp_servers ADD COLUMN read_only TEXT NOT NULL DEFAULT '[]'")


async def _erasure_journal(conn: aiosqlite.Connection) -> None:
    # Which conversations and accounts were erased, by id only: every serving process reads
    # it to drop what it holds of them in RAM, whichever process erased them.
    await _script(
        conn,
        """
        CREATE TABLE erasure_journal (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            at REAL NOT NULL,
            kind TEXT NOT NULL,
            subject TEXT NOT NULL
        );
        CREATE INDEX erasure_journal_by_at ON erasure_journal (at);
        """,
    )


async def _runtime_rollout(conn: aiosqlite.Connection) -> None:
    # Canaries an admin started at run time (beside the policy file's) and the models pinned
    # warm: configuration every front reads at its next check, never content.
    await _script(
        conn,
        """
        CREATE TABLE canaries_started (
            arm TEXT PRIMARY KEY,
            tier TEXT NOT NULL,
            model TEXT NOT NULL,
            percent REAL NOT NULL,
            actor_name TEXT NOT NULL,
            at REAL NOT NULL
        );
        CREATE TABLE prewarm_pins (
            model TEXT PRIMARY KEY,
            actor_name TEXT NOT NULL,
            at REAL NOT NULL
        );
        """,
    )


async def _draft_usage(conn: aiosqlite.Connection) -> None:
    # Who asked and the tokens so far, saved with each draft, so an answer whose front died
    # is charged to its requester when another front (or a restart) recovers it.
    await _script(
        conn,
        """
        ALTER TABLE drafts ADD COLUMN user_id TEXT;
        ALTER TABLE drafts ADD COLUMN prompt_tokens INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE drafts ADD COLUMN completion_tokens INTEGER NOT NULL DEFAULT 0;
        """,
    )


MIGRATIONS: list[tuple[str, Migration]] = [
    ("0001_initial", _initial),
    ("0002_accounts", _accounts),
    ("0003_knowledge", _knowledge),
    ("0004_turn_routing", _turn_routing),
    ("0005_audit_log", _audit_log),
    ("0006_moderation", _moderation),
    ("0007_data_rules", _data_rules),
    ("0008_summaries", _summaries),
    ("0009_replicas", _replicas),
    ("0010_teams", _teams),
    ("0011_import_staging", _import_staging),
    ("0012_audit_refuses_replace", _audit_refuses_replace),
    ("0013_feedback", _feedback),
    ("0014_mcp_servers", _mcp_servers),
    ("0015_usage_by_hour", _usage_by_hour),
    ("0016_evals_and_canary_verdicts", _evals_and_canary_verdicts),
    ("0017_tool_turns", _tool_turns),
    ("0018_draft_front", _draft_front),
    ("0019_shared_limits", _shared_limits),
    ("0020_shared_fleet", _shared_fleet),
    ("0021_password_reset_notice", _password_reset_notice),
    ("0022_responses", _responses),
    ("0023_identities", _identities),
    ("0024_mcp_read_only", _mcp_read_only),
    ("0025_erasure_journal", _erasure_journal),
    ("0026_runtime_rollout", _runtime_rollout),
    ("0027_draft_usage", _draft_usage),
]


async def apply_migrations(conn: aiosqlite.Connection) -> list[str]:
    """Apply every migration not yet recorded, in order; returns the names applied now."""
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
