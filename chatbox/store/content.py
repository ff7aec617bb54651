"""The content registry: every table and file that can hold user content, in one place.

Content is what a person wrote or uploaded, and anything that decodes back to it: turns,
drafts, summaries, titles, memory facts, documents and their chunks, their FTS index and
their vectors, share snapshots, moderation items' text, parked KV (token ids are the text).
Each table declares its owner scope, which of its text or blob columns hold content (and why
each other one does not), and, for each kind of erasure, which of its rows that erasure takes
and how (delete, blank, forget from an FTS index, drop vectors), and where a user's export
holds its content (or why it does not). `chatbox.store.erasure` runs these in the order
listed here; tests/data/test_content_registry.py fails when the schema has
a table or a text column that is not declared here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatch
from typing import Literal

Scope = Literal["user", "workspace", "conversation"]
# The erasures. Their parameters, as named SQL parameters: conversation (:user, :conv, :now),
# account (:user, :now), workspace (:ws), document (:doc), memory (:memory), share (:share).
Kind = Literal["conversation", "account", "workspace", "document", "memory", "share"]
KINDS: tuple[Kind, ...] = ("conversation", "account", "workspace", "document", "memory", "share")


@dataclass(frozen=True)
class Delete:
    """Delete the rows matching `where`."""

    where: str


@dataclass(frozen=True)
class Blank:
    """Keep the rows matching `where` as content-free tombstones: `SET` this."""

    where: str
    set: str


@dataclass(frozen=True)
class Forget:
    """An external-content FTS5 table forgets a row only when told its old text: the rows of
    its source table matching `where` are told to it as deleted (before they go)."""

    where: str


@dataclass(frozen=True)
class DropVectors:
    """`rows` selects (rowid, partition) of the vectors to delete; the in-RAM indexes are told."""

    rows: str


@dataclass(frozen=True)
class WithParent:
    """The rows go with their parent's (a trigger or a cascading foreign key)."""

    parent: str


Action = Delete | Blank | Forget | DropVectors | WithParent


@dataclass(frozen=True)
class InExport:
    """Where a user's export (`chatbox.data.export`) holds this table's content: a glob of
    the zip's file names."""

    files: str


DERIVED = "derived from content exported elsewhere (an index of it)"

# Reasons shared by many plain (non-content) columns.
ID = "an identifier"
NAMES_MODEL = "a model's name (the catalogue's, not a person's words)"
ENUM = "one word of a fixed set"
HASH = "a one-way hash"


@dataclass(frozen=True)
class Table:
    """One table: whose rows they are, which columns hold content, and how each erasure
    takes them. `scope` None: the rows belong to no person (the appliance's own)."""

    name: str
    scope: Scope | None
    content: tuple[str, ...] = ()
    plain: Mapping[str, str] = field(default_factory=dict)  # column: why it is not content
    erase: Mapping[Kind, Action] = field(default_factory=dict)
    virtual: Literal["fts5", "vec0"] | None = None
    source: tuple[str, str] | None = None  # fts5: (content table, its rowid column)
    counts: tuple[Kind, str] | None = None  # (erasure, `Erased` field counting its rows here)
    why: str = ""  # for a table that no erasure touches, or that holds no person's data
    export: InExport | str = ""  # a content table: where the export holds it, or why not


TABLES: tuple[Table, ...] = (
    # -- a conversation: the tombstone first (the turns' triggers then let them go) --------
    Table(
        "conversations",
        "conversation",
        ("title", "system_prompt"),
        {
            "id": ID,
            "user_id": ID,
            "model": NAMES_MODEL,
            "active_leaf_id": ID,
            "workspace_id": ID,
        },
        {
            "conversation": Blank(
                "id = :conv AND user_id = :user AND erased_at IS NULL",
                "title = NULL, system_prompt = NULL, model = NULL, active_leaf_id = NULL,"
                " deleted_at = coalesce(deleted_at, :now), erased_at = :now, updated_at = :now",
            ),
            "workspace": Blank("workspace_id = :ws", "workspace_id = NULL"),
        },
        counts=("conversation", "conversations"),
        export=InExport("conversations.json"),
    ),
    Table(
        "turn_fts",
        "conversation",
        ("content",),
        erase={"conversation": Forget("conversation_id = :conv")},
        virtual="fts5",
        source=("turns", "seq"),
        export=DERIVED,
    ),
    Table(
        "turn_vec",
        "conversation",
        ("embedding",),
        {"rowid": ID, "user_id": ID},
        {
            "conversation": DropVectors(
                "SELECT seq, :user FROM turns WHERE conversation_id = :conv"
            ),
            # Vectors of turns no longer there (written just before an erasure), if any.
            "account": DropVectors("SELECT rowid, user_id FROM turn_vec WHERE user_id = :user"),
        },
        virtual="vec0",
        export=DERIVED,
    ),
    Table(
        "turn_citations",
        "conversation",
        (),
        {"turn_id": ID},
        {
            "conversation": Delete(
                "turn_id IN (SELECT id FROM turns WHERE conversation_id = :conv)"
            ),
            "document": WithParent("chunks"),
        },
        why="which passages an answer cited (ids and scores only)",
    ),
    Table(
        "summaries",
        "conversation",
        ("content",),
        {"id": ID, "conversation_id": ID, "covers_id": ID, "model": NAMES_MODEL},
        {"conversation": Delete("conversation_id = :conv")},
        export="a model's summary of turns that are exported",
    ),
    Table(
        "drafts",
        "conversation",
        ("content",),
        {
            "id": ID,
            "conversation_id": ID,
            "parent_id": ID,
            "model": NAMES_MODEL,
            "route": "how the model was chosen (a rule's name)",
            "arm": "a canary arm's name",
            "degraded_from": NAMES_MODEL,
            "front": "which server process writes the answer (a random number)",
            "user_id": ID + " (who asked: a recovered answer is charged to them)",
        },
        {
            "conversation": Delete("conversation_id = :conv"),
            "account": Blank("user_id = :user", "user_id = NULL"),
        },
        export="an answer being written; exported once it is a turn",
    ),
    Table(
        "moderation_items",
        "user",
        ("text", "source"),
        {
            "id": ID,
            "user_id": ID,
            "tier": ENUM,
            "direction": ENUM,
            "action": ENUM,
            "category": ENUM,
            "scores": "the classifier's numbers per category (JSON)",
            "conversation_id": ID,
            "turn_id": ID,
            "status": ENUM,
            "resolved_by": "the reviewing admin's name",
        },
        {
            "conversation": Blank("conversation_id = :conv", "text = NULL, source = NULL"),
            "account": Blank("user_id = :user", "text = NULL, source = NULL"),
        },
        export="the admins' review record of a check, not the user's own data",
    ),
    Table(
        "feedback",
        "conversation",
        ("comment",),
        {
            "turn_id": ID,
            "conversation_id": ID,
            "user_id": ID,
            "rating": ENUM,
            "model": NAMES_MODEL,
            "arm": "a canary arm's name",
            "tier": "a policy tier's name",
        },
        {
            # Before the turns it names (a foreign key), whoever in its workspace rated them.
            "conversation": Delete("conversation_id = :conv"),
            # What the person said of answers in conversations that stay (a workspace's).
            "account": Delete("user_id = :user"),
        },
        export=InExport("feedback.json"),
    ),
    Table(
        "tool_results",
        "user",
        ("result",),
        {
            "key": HASH,
            "user_id": ID,
            "conversation_id": ID,
            "tool": "a tool's name (the catalogue of tools, not a person's words)",
        },
        {
            # A pure tool's result too (each result names the conversation whose call made
            # it); one cached before they did goes with any of its user's conversations.
            "conversation": Delete(
                "conversation_id = :conv OR (conversation_id IS NULL AND user_id = :user)"
            ),
            "account": Delete("user_id = :user"),
        },
        export="a cache of tool results; each result is exported as its turn",
    ),
    Table(
        "responses",
        "user",
        ("input", "output"),
        {"id": ID, "user_id": ID, "model": NAMES_MODEL},
        # Each is deleted by its owner too, and past the tier's retention by the sweeper.
        {"account": Delete("user_id = :user")},
        export=InExport("responses.json"),
    ),
    Table(
        "turns",
        "conversation",
        ("content", "error"),
        {
            "id": ID,
            "conversation_id": ID,
            "parent_id": ID,
            "role": ENUM,
            "status": ENUM,
            "model": NAMES_MODEL,
            "route": "how the model was chosen (a rule's name)",
            "arm": "a canary arm's name",
            "degraded_from": NAMES_MODEL,
            "author_id": ID,
        },
        {"conversation": Delete("conversation_id = :conv")},
        counts=("conversation", "turns"),
        export=InExport("conversations.json"),
    ),
    Table(
        "memory_extractions",
        "conversation",
        (),
        {"conversation_id": ID},
        {"conversation": Delete("conversation_id = :conv")},
        why="how far memory extraction has read a conversation (a turn number)",
    ),
    # -- a document: its vectors, then its chunks (their trigger tells chunk_fts) -------------
    Table(
        "chunk_vec",
        "user",
        ("embedding",),
        {"rowid": ID, "user_id": ID},
        {
            "document": DropVectors("SELECT seq, user_id FROM chunks WHERE document_id = :doc"),
            "account": DropVectors("SELECT rowid, user_id FROM chunk_vec WHERE user_id = :user"),
        },
        virtual="vec0",
        export=DERIVED,
    ),
    Table(
        "chunk_fts",
        "user",
        ("text",),
        erase={"document": WithParent("chunks")},
        virtual="fts5",
        source=("chunks", "seq"),
        export=DERIVED,
    ),
    Table(
        "chunks",
        "user",
        ("text",),
        {"document_id": ID, "user_id": ID},
        {"document": Delete("document_id = :doc")},
        export=InExport("documents/*"),
    ),
    Table(
        "documents",
        "user",
        ("name",),
        {
            "id": ID,
            "user_id": ID,
            "conversation_id": ID,
            "workspace_id": ID,
            "mime": "the file's media type",
        },
        {"document": Delete("id = :doc")},
        counts=("document", "documents"),
        export=InExport("documents/index.json"),
    ),
    # -- a memory fact ------------------------------------------------------------------------
    Table(
        "memory_vec",
        "user",
        ("embedding",),
        {"rowid": ID, "user_id": ID},
        {
            "memory": DropVectors("SELECT seq, user_id FROM memories WHERE seq = :memory"),
            "account": DropVectors("SELECT rowid, user_id FROM memory_vec WHERE user_id = :user"),
        },
        virtual="vec0",
        export=DERIVED,
    ),
    Table(
        "memories",
        "user",
        ("text",),
        {"id": ID, "user_id": ID, "source": ENUM, "conversation_id": ID},
        {"memory": Delete("seq = :memory")},
        counts=("memory", "memories"),
        export=InExport("memory.json"),
    ),
    # -- a share link: its snapshot's text ------------------------------------------------------
    Table(
        "share_passages",
        "user",
        ("document", "text"),
        {"share_id": ID},
        {"share": Delete("share_id = :share")},
        export="a snapshot of exported turns and passages, for the link's readers",
    ),
    Table(
        "share_turns",
        "user",
        ("content",),
        {"share_id": ID, "role": ENUM, "model": NAMES_MODEL},
        {"share": Delete("share_id = :share")},
        export="a snapshot of exported turns, for the link's readers",
    ),
    Table(
        "shares",
        "user",
        ("title",),
        {
            "id": ID,
            "token_hash": HASH,
            "user_id": ID,
            "conversation_id": ID,
            "upto_turn_id": ID,
        },
        {"share": Delete("id = :share")},
        export="a snapshot's title, copied from an exported conversation",
    ),
    # -- a workspace ----------------------------------------------------------------------------
    Table(
        "workspace_members",
        "user",
        (),
        {"workspace_id": ID, "user_id": ID, "role": ENUM},
        {"account": Delete("user_id = :user"), "workspace": Delete("workspace_id = :ws")},
        why="who belongs to a workspace",
    ),
    Table(
        "workspaces",
        "workspace",
        ("system_prompt",),
        {"id": ID, "name": "the name an admin gave it (the audit log names it too)"},
        {"workspace": Delete("id = :ws")},
        export="the workspace's, not one member's",
    ),
    # -- an account: what is left of it once its content is gone -------------------------------
    Table(
        "turn_vec_progress",
        "user",
        (),
        {"user_id": ID},
        {"account": Delete("user_id = :user")},
        why="how far the user's turns are indexed (a turn number)",
    ),
    Table(
        "identities",
        "user",
        ("email", "full_name"),
        {
            "issuer": "the identity provider's URL, or 'proxy'",
            "subject": "the provider's id for the person",
            "user_id": ID,
            "group_names": "the provider's group names the person was in at their last sign-in",
            "csrf_token": "a random token, no content",
        },
        {"account": Delete("user_id = :user")},
        export="the identity provider's own record of the person, which it holds",
    ),
    Table(
        "sessions",
        "user",
        (),
        {"token_hash": HASH, "user_id": ID, "csrf_token": "a random token, no content"},
        {"account": Delete("user_id = :user")},
        why="the user's logins",
    ),
    Table(
        "api_keys",
        "user",
        (),
        {
            "id": ID,
            "user_id": ID,
            "name": "the label an admin gave a key (the audit log names it too)",
            "prefix": "the key's first characters, to tell keys apart",
            "key_hash": HASH,
        },
        {"account": Delete("user_id = :user")},
        why="the user's API keys",
    ),
    Table(
        "usage",
        "user",
        (),
        {"user_id": ID, "model": NAMES_MODEL, "day": "a date", "arm": "a canary arm's name"},
        why="counts only; they stay attributed to the nameless account",
    ),
    Table(
        "users",
        "user",
        ("name",),
        {
            "id": ID,
            "role": ENUM,
            "tier": "a policy tier's name",
            "password_hash": HASH + ", cleared on erasure",
        },
        {
            "account": Blank(
                "id = :user",
                "name = 'deleted:' || id, password_hash = NULL, disabled = 1, role = 'member',"
                " zero_retention = 0, deleted_at = :now",
            )
        },
        export=InExport("README.txt"),
    ),
    # -- the appliance's own ------------------------------------------------------------------
    Table(
        "usage_hours",
        None,
        plain={"model": NAMES_MODEL},
        why="requests and tokens per model and hour, of no one in particular (pre-warming)",
    ),
    Table(
        "audit_log",
        None,
        plain={
            "actor_id": ID,
            "actor_name": "who acted, copied in so an entry outlives a deleted account",
            "action": ENUM,
            "target_id": ID,
            "target_name": "on whom, copied in so an entry outlives a deleted account",
            "detail": "a small JSON detail; AuditLog.record refuses content fields",
        },
        why="append-only record of admin actions, never content",
    ),
    Table(
        "replicas",
        None,
        plain={
            "url": "a replica's address",
            "kind": ENUM,
            "models": "model names served there",
            "secret": "the replica's bearer token",
        },
        why="router mode's configuration",
    ),
    Table(
        "replica_drains",
        None,
        plain={"url": "a replica's address"},
        why="which replicas take no new work (router mode's configuration)",
    ),
    Table(
        "replica_placements",
        None,
        plain={
            "key": "a conversation's id, or a one-way hash of an API call's first messages",
            "url": "a replica's address",
        },
        why="where routed keys' caches are, shared by the fronts; dropped after a week unused",
    ),
    Table(
        "replica_loads",
        None,
        plain={
            "front": "a running front's random id",
            "url": "a replica's address",
            "model": NAMES_MODEL,
        },
        why="how many answers each front has on each replica now, for admission",
    ),
    Table(
        "mcp_servers",
        None,
        plain={
            "name": ID,
            "transport": ENUM,
            "command": "the server's command line, as an admin gave it",
            "url": "the server's address",
            "env": "the server's environment variables (may hold its secrets)",
            "headers": "the server's request headers (may hold its secrets)",
            "tiers": "tier names",
            "workspaces": "workspace ids",
            "read_only": "names of the server's tools marked read-only",
        },
        why="the MCP servers' configuration",
    ),
    Table(
        "eval_runs",
        None,
        plain={
            "id": ID,
            "model": NAMES_MODEL,
            "suite": "the eval suite's name (the admin's file)",
            "suite_digest": HASH,
            "judge": NAMES_MODEL,
            "actor_name": "who ran it (an admin or the CLI)",
        },
        why="eval runs of the admin's suites, never a person's content",
    ),
    Table(
        "eval_results",
        None,
        plain={
            "run_id": ID,
            "case_id": "a case's name in the admin's suite",
            "category": ENUM,
            "check_kind": ENUM,
            "answer": "a model's answer to the admin's suite prompt, not a person's",
            "detail": "why the check passed or failed (figures, the rule)",
        },
        why="eval results of the admin's suites, never a person's content",
    ),
    Table(
        "canary_events",
        None,
        plain={
            "arm": "a canary arm's name",
            "tier": "a policy tier's name",
            "model": NAMES_MODEL,
            "action": ENUM,
            "reason": "the verdict's rule and figures, or the admin's reason",
            "actor_name": "who decided (an admin, the CLI, or chatbox itself)",
        },
        why="append-only canary decisions, never content",
    ),
    Table(
        "canaries_started",
        None,
        plain={
            "arm": "a canary arm's name",
            "tier": "a policy tier's name",
            "model": NAMES_MODEL,
            "actor_name": "the admin who started it",
        },
        why="canaries started at run time beside the policy file's: configuration",
    ),
    Table(
        "prewarm_pins",
        None,
        plain={"model": NAMES_MODEL, "actor_name": "the admin who pinned it"},
        why="models kept loaded whatever their hours: configuration",
    ),
    Table(
        "canary_verdicts",
        None,
        plain={
            "arm": "a canary arm's name",
            "tier": "a policy tier's name",
            "model": NAMES_MODEL,
            "verdict": ENUM,
            "reason": "the verdict's rule and figures",
            "detail": "per-metric figures and intervals (JSON numbers)",
        },
        why="each canary's latest verdict: aggregate figures, never content",
    ),
    Table(
        "limit_buckets",
        None,
        plain={"key": "a user's id and a limit's name"},
        why="rate limits' levels (a number per user and limit), refilled within a minute",
    ),
    Table(
        "limit_leases",
        None,
        plain={"id": ID, "key": "a user's id", "front": "a running front's random id"},
        why="answers being written now, per user; each expires with its front's lease",
    ),
    Table(
        "limit_failures",
        None,
        plain={"counter": ENUM, "key": "a login name or an address, as a failed attempt gave it"},
        why="times of failed logins and keys, kept for the throttle's window only",
    ),
    Table(
        "job_claims",
        None,
        plain={"name": "a background job's kind and target id", "front": "a front's random id"},
        why="which front does which background job",
    ),
    Table(
        "erasure_journal",
        None,
        plain={"kind": ENUM, "subject": ID},
        why="which conversations and accounts were erased (ids only, kept a day): every serving"
        " process drops what it holds of them in RAM",
    ),
    Table(
        "sign_in_starts",
        None,
        plain={
            "state_hash": HASH,
            "browser_hash": HASH,
            "nonce": "a random token, no content",
            "code_verifier": "a random token, no content",
            "redirect_uri": "this app's own callback URL",
            "next": "a path of this app to go to once signed in",
        },
        why="sign-ins sent to the identity provider, each kept until its callback or 10 minutes",
    ),
    Table("meta", None, plain={"key": ID, "value": "the schema's name"}, why="the schema"),
    Table("migrations", None, plain={"name": ID}, why="which migrations ran"),
)

# Compound erasures: each first erases these parts (kind, and the query that lists them, its
# column named as the part's parameter; the other parameters pass down), then its own rows.
PARTS: Mapping[Kind, tuple[tuple[Kind, str], ...]] = {
    # A conversation's attachments and the facts extracted from it go with it, whoever in
    # its workspace added them.
    "conversation": (
        ("document", "SELECT id AS doc FROM documents WHERE conversation_id = :conv"),
        (
            "memory",
            "SELECT seq AS memory FROM memories WHERE conversation_id = :conv"
            " AND source = 'extracted'",
        ),
    ),
    "account": (
        (
            "conversation",
            "SELECT id AS conv FROM conversations WHERE user_id = :user AND erased_at IS NULL",
        ),
        ("document", "SELECT id AS doc FROM documents WHERE user_id = :user"),
        ("memory", "SELECT seq AS memory FROM memories WHERE user_id = :user"),
        ("share", "SELECT id AS share FROM shares WHERE user_id = :user"),
    ),
    "workspace": (("document", "SELECT id AS doc FROM documents WHERE workspace_id = :ws"),),
}

# The parameter that names one erasure's subject, and the gate that says it is there to erase.
SUBJECT: Mapping[Kind, str] = {
    "conversation": "SELECT 1 FROM conversations WHERE id = :conv AND user_id = :user"
    " AND erased_at IS NULL",
    "account": "SELECT 1 FROM users WHERE id = :user",
    "workspace": "SELECT 1 FROM workspaces WHERE id = :ws",
    "document": "SELECT 1 FROM documents WHERE id = :doc",
    "memory": "SELECT 1 FROM memories WHERE seq = :memory",
    "share": "SELECT 1 FROM shares WHERE id = :share",
}


@dataclass(frozen=True)
class Artifact:
    """A place outside the database's tables that can hold content."""

    where: str  # a glob under the data directory (`*` spans folders), or a place in words
    scope: Scope | None
    holds: str
    erased: str
    on_disk: bool = True


ARTIFACTS: tuple[Artifact, ...] = (
    Artifact(
        "chatbox.db*",
        "user",
        "every table above (the -wal and -shm files are the database's)",
        "each erasure above, with secure_delete and FTS5 secure-delete zeroing freed bytes"
        " and a WAL checkpoint before it answers",
    ),
    Artifact(
        "store-in-postgresql.txt",
        None,
        "where the store is when it is in PostgreSQL: the database's URL without its"
        " password; no person's data",
        "never: deleted by an admin who moves the store back to SQLite",
    ),
    Artifact(
        "kv/*",
        "conversation",
        "parked KV cache: a conversation's token ids (its text) and attention state",
        "a conversation's erasure deletes its files for every model (engine forget)",
    ),
    Artifact(
        "models/*",
        None,
        "GGUF model files and the catalogue's registry; no person's data",
        "never: an admin removes models",
    ),
    Artifact(
        "alert-baselines.json",
        None,
        "the alert rules' learned baselines: a mean and variance per signal; no person's data",
        "nothing to erase",
    ),
    Artifact(
        "files/*",
        "user",
        "nothing: an upload's text lives in `chunks`, the file itself is never kept",
        "nothing to erase",
    ),
    Artifact(
        "RAM: live and parked KV",
        "conversation",
        "a conversation's KV in the engine's slots and its host-RAM park",
        "a conversation's erasure drops it from every loaded engine (and every replica)",
        on_disk=False,
    ),
    Artifact(
        "RAM: temporary chats",
        "user",
        "a temporary chat's messages, never written",
        "gone after an idle hour, at shutdown, or when the user ends it",
        on_disk=False,
    ),
    Artifact(
        "RAM: cached API answers",
        "user",
        "the answer cache: response bodies of deterministic OpenAI-API requests, by a hash"
        " of the user and the request (chatbox/chat/caches/answer_cache.py); never under zero"
        " retention",
        "an account's erasure drops the answers its requests wrote; each is gone after"
        " `answer_cache.ttl_s`, when evicted, or at shutdown",
        on_disk=False,
    ),
    Artifact(
        "RAM: semantic answer cache",
        "user",
        "first questions of conversations, their MiniLM vectors and answers, for tiers the"
        " policy's `semantic_cache.tiers` names (chatbox/chat/caches/semantic_cache.py); scoped to"
        " the user, the workspace or a public tier; never read or written under zero"
        " retention; not exported (the conversation it came from is)",
        "an account's erasure drops what its questions wrote, a conversation's erasure what"
        " was first answered in it; each is gone after `semantic_cache.ttl_s`, when evicted,"
        " or at shutdown",
        on_disk=False,
    ),
    Artifact(
        "exports",
        "user",
        "a user's export zip: built in RAM and sent; the CLI writes it (0600) where told",
        "never kept by chatbox",
        on_disk=False,
    ),
    Artifact(
        "logs and traces",
        None,
        "stdout/stderr and spans in RAM (and OTLP when configured): ids and counts, no content",
        "nothing to erase",
        on_disk=False,
    ),
)

BY_NAME: Mapping[str, Table] = {t.name: t for t in TABLES}


def table(name: str) -> Table:
    """The declaration of one table (KeyError for one not declared)."""
    return BY_NAME[name]


def holding_content() -> tuple[Table, ...]:
    """The tables with a content column."""
    return tuple(t for t in TABLES if t.content)


def content_columns() -> tuple[tuple[str, str], ...]:
    """Every (table, column) that holds content."""
    return tuple((t.name, column) for t in TABLES for column in t.content)


def shadow_of(name: str) -> Table | None:
    """The declared virtual table whose storage `name` is (FTS5 and vec0 shadow tables)."""
    for t in TABLES:
        if t.virtual is not None and name.startswith(t.name + "_"):
            return t
    return None


def artifact_of(relative: str) -> Artifact | None:
    """The declared artifact a file under the data directory (its relative path) is part of."""
    return next((a for a in ARTIFACTS if a.on_disk and fnmatch(relative, a.where)), None)
