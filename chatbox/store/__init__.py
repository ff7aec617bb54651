"""Storage: SQLite (WAL) through aiosqlite with sqlite-vec, or PostgreSQL through asyncpg
(chatbox/store/pg.py); SQL lives only here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from chatbox.store.audit import AuditEntry, AuditRepo
from chatbox.store.canaries import CanaryRepo
from chatbox.store.conversations import ConversationRepo
from chatbox.store.db import Database
from chatbox.store.documents import Chunk, ChunkIn, Document, DocumentRepo
from chatbox.store.evals import EvalRepo
from chatbox.store.feedback import Feedback, FeedbackRepo, FeedbackTally
from chatbox.store.identities import Identity, IdentityRepo, SignInStart
from chatbox.store.jobs import JobRepo
from chatbox.store.keys import ApiKey, KeyRepo
from chatbox.store.limits import Counters, MemoryCounters
from chatbox.store.mcp_servers import McpServerRepo, McpServerRow
from chatbox.store.memories import Memory, MemoryRepo
from chatbox.store.moderation import ModerationItem, ModerationRepo
from chatbox.store.pins import PinRepo
from chatbox.store.records import Conversation, Routing, Turn, TurnStatus, TurnUsage, User
from chatbox.store.replicas import ReplicaRepo, ReplicaRow
from chatbox.store.responses import ResponseRepo, StoredResponse
from chatbox.store.search import SearchRepo, TurnHit
from chatbox.store.sessions import Session, SessionRepo
from chatbox.store.shares import ShareRepo
from chatbox.store.summaries import Summary, SummaryRepo
from chatbox.store.tool_results import ToolResultRepo
from chatbox.store.turns import TurnRepo
from chatbox.store.usage import UsageRepo, UsageRow
from chatbox.store.users import UserRepo
from chatbox.store.vector_feed import VectorChange
from chatbox.store.vectors import VectorRepo
from chatbox.store.workspaces import WorkspaceRepo

__all__ = [
    "ApiKey",
    "AuditEntry",
    "Chunk",
    "ChunkIn",
    "Conversation",
    "Counters",
    "Database",
    "Document",
    "Feedback",
    "FeedbackTally",
    "Identity",
    "McpServerRow",
    "Memory",
    "ModerationItem",
    "ReadReplica",
    "ReplicaRow",
    "Routing",
    "Session",
    "SignInStart",
    "Store",
    "StoredResponse",
    "Summary",
    "Turn",
    "TurnHit",
    "TurnStatus",
    "TurnUsage",
    "UsageRow",
    "User",
    "VectorChange",
]


@dataclass(frozen=True)
class ReadReplica:
    """A PostgreSQL streaming replica of the store's database, for conversation reads."""

    url: str
    max_lag_s: float = 10.0  # further behind than this, it serves nothing


async def open_database(target: Path | str, replica: ReadReplica | None = None) -> Database:
    """The SQLite database at a path, or the PostgreSQL one at a `postgresql://` URL (with
    its conversation reads on `replica`, where one is given)."""
    from chatbox.store.pg import PgDatabase, is_url  # asyncpg loads only when it is used

    if is_url(target):
        db = await PgDatabase.connect(str(target))
        if replica is not None:
            from chatbox.store.pg_replica import ReplicaReads

            await ReplicaReads.attach(db, replica.url, replica.max_lag_s)
        return db
    if replica is not None:
        raise ValueError("a read replica needs the store in PostgreSQL")
    return await Database.open(target)


@dataclass
class Store:
    """The database and one repository per aggregate."""

    db: Database
    users: UserRepo
    conversations: ConversationRepo
    turns: TurnRepo
    keys: KeyRepo
    sessions: SessionRepo
    usage: UsageRepo
    memories: MemoryRepo
    documents: DocumentRepo
    search: SearchRepo
    vectors: VectorRepo
    audit: AuditRepo
    moderation: ModerationRepo
    replicas: ReplicaRepo
    summaries: SummaryRepo
    shares: ShareRepo
    workspaces: WorkspaceRepo
    feedback: FeedbackRepo
    mcp_servers: McpServerRepo
    evals: EvalRepo
    canaries: CanaryRepo
    tool_results: ToolResultRepo
    responses: ResponseRepo
    jobs: JobRepo
    identities: IdentityRepo
    pins: PinRepo
    counters: Counters  # limits' counters: this process's on SQLite, the database's on PostgreSQL

    @classmethod
    async def open(cls, target: Path | str, replica: ReadReplica | None = None) -> Store:
        """The store at a SQLite path or a `postgresql://` URL (and its read replica)."""
        db = await open_database(target, replica)
        counters: Counters = MemoryCounters()
        if db.dialect == "postgresql":
            from chatbox.store.limits import PgCounters
            from chatbox.store.pg import PgDatabase

            assert isinstance(db, PgDatabase)
            counters = PgCounters(db)
        return cls(
            db,
            UserRepo(db),
            ConversationRepo(db),
            TurnRepo(db),
            KeyRepo(db),
            SessionRepo(db),
            UsageRepo(db),
            MemoryRepo(db),
            DocumentRepo(db),
            SearchRepo(db),
            VectorRepo(db),
            AuditRepo(db),
            ModerationRepo(db),
            ReplicaRepo(db),
            SummaryRepo(db),
            ShareRepo(db),
            WorkspaceRepo(db),
            FeedbackRepo(db),
            McpServerRepo(db),
            EvalRepo(db),
            CanaryRepo(db),
            ToolResultRepo(db),
            ResponseRepo(db),
            JobRepo(db),
            IdentityRepo(db),
            PinRepo(db),
            counters,
        )

    async def close(self) -> None:
        await self.usage.settled()
        await self.counters.close()
        await self.db.close()
