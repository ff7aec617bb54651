"""The store's database: one interface, on SQLite (the default) or PostgreSQL (`chatbox.store.pg`).

SQLite: sqlite-vec loaded, WAL mode, one serialized writer path, and a second connection for
reads a person waits on beside the writes (`Database.snapshot`). Repositories write `?`
placeholders; SQL that differs between the two asks `db.dialect`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import aiosqlite
import sqlean
import sqlite_vec

from chatbox.store.migrations import apply_migrations
from chatbox.store.outage import unreachable
from chatbox.store.vector_feed import VectorFeed

if TYPE_CHECKING:
    from chatbox.store.run_channel import RunChannel

log = logging.getLogger("chatbox.store")
CHECKPOINT_TRIES = 5  # a checkpoint refused by a read on the same connection is retried
WRITE_CHECK_S = 5.0  # a readiness write slower than this counts as failed
IN_BATCH = 500  # keys per `IN (...)`, well under SQLITE_MAX_VARIABLE_NUMBER
PRIVATE_FILE_MODE = 0o600  # the database and its -wal/-shm: this user's eyes only
# The user a request (and every task it starts) acts for: their writes and reads are paired
# so a read replica serves their reads only once it holds their writes (store/pg_replica.py).
_ACTOR: ContextVar[str | None] = ContextVar("chatbox_store_actor", default=None)


def act_for(user_id: str) -> None:
    """Attribute this task's store work from here on (and its child tasks') to `user_id`."""
    _ACTOR.set(user_id)


def actor() -> str | None:
    """The user this task's store work is attributed to, if any."""
    return _ACTOR.get()


# Inside a write transaction: the users it is attributed to besides the actor; else None.
WRITE_ALSO: ContextVar[list[str] | None] = ContextVar("chatbox_store_write_also", default=None)


def also_for(user_id: str) -> None:
    """Attribute the write transaction in progress to `user_id` too: a change to what they
    may see (their removal from a workspace) must reach their next read."""
    users = WRITE_ALSO.get()
    if users is not None:
        users.append(user_id)


def _make_private(path: Path) -> None:
    """Create the database file 0600 if it is new, and make it and its -wal/-shm 0600.

    SQLite gives the -wal and -shm files it creates the mode of the database file, so a
    private database keeps them private; existing ones (from before) are tightened here."""
    if not path.exists():
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE_MODE))  # empty: a new db
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        with contextlib.suppress(FileNotFoundError):
            if file.stat().st_mode & 0o777 != PRIVATE_FILE_MODE:
                file.chmod(PRIVATE_FILE_MODE)


def _connect_sync(path: Path, read_only: bool = False) -> Any:
    """A sqlite3-compatible connection that can load extensions (stdlib's here cannot);
    `read_only`: one that refuses writes (the search reader)."""
    _make_private(path)
    conn = sqlean.connect(str(path), isolation_level=None, check_same_thread=False)
    conn.enable_load_extension(True)
    sqlite_vec.load(conn)
    conn.enable_load_extension(False)
    conn.row_factory = sqlean.Row
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("PRAGMA busy_timeout=5000")
    conn.execute("PRAGMA secure_delete=ON")  # erased content is zeroed, not left in free pages
    if read_only:
        conn.execute("PRAGMA query_only=ON")
    _make_private(path)  # the -wal/-shm that WAL mode just opened
    return conn


Dialect = Literal["sqlite", "postgresql"]


class Reader(Protocol):
    """Reads that see the last commit (`Database.snapshot`)."""

    async def fetchone(self, sql: str, params: Iterable[Any] = ()) -> Any: ...

    async def fetchall(self, sql: str, params: Iterable[Any] = ()) -> list[Any]: ...

    async def fetchall_in(
        self, sql: str, keys: Sequence[Any], params: Iterable[Any] = ()
    ) -> list[Any]: ...


class BatchedReads:
    """`fetchall_in` on top of a reader's own `fetchall`."""

    async def fetchall(self, sql: str, params: Iterable[Any] = ()) -> list[Any]:
        raise NotImplementedError

    async def fetchall_in(
        self, sql: str, keys: Sequence[Any], params: Iterable[Any] = ()
    ) -> list[Any]:
        """Rows of `sql` whose `{marks}` takes the keys, in batches under SQLite's variable
        limit; `params` follow the keys in every batch."""
        rows: list[Any] = []
        rest = tuple(params)
        for at in range(0, len(keys), IN_BATCH):
            part = list(keys[at : at + IN_BATCH])
            marks = ", ".join("?" for _ in part)
            rows.extend(await self.fetchall(sql.format(marks=marks), (*part, *rest)))
        return rows


class Database(BatchedReads):
    """An open database. Reads go straight through; writes go through `transaction()`, which
    yields a connection with aiosqlite's `execute` and `executemany` (on either dialect).
    `snapshot` takes reads that need no uncommitted write and should not wait for the writer."""

    dialect: Dialect = "sqlite"

    def __init__(self) -> None:
        # A pool's reads already run beside its writes: the database is its own snapshot.
        self.snapshot: Reader = self
        self._write_lock = asyncio.Lock()
        self.vector_changes = VectorFeed()  # committed vector writes, for in-RAM indexes
        self.runs: RunChannel | None = None  # the other fronts on this database (PostgreSQL)
        # Told (kind, seconds) of each read and each whole write transaction (metrics).
        self.on_op: Callable[[str, float], None] | None = None
        # Conversation reads (lists, a conversation's turns, search): a read replica may serve
        # them where one is configured (store/pg_replica.py); otherwise this database.
        self.conversation_reads: Reader = self
        # Told (served_by, reason) of each conversation read a replica could have served.
        self.on_read_route: Callable[[str, str], None] | None = None

    def _timed(self, op: str, t0: float) -> None:
        if self.on_op is not None:
            self.on_op(op, time.perf_counter() - t0)

    @classmethod
    async def open(cls, target: Path | str) -> Database:
        """The SQLite database at a path (a `postgresql://` URL: `chatbox.store.open_database`)."""
        if str(target).startswith(("postgresql://", "postgres://")):
            raise ValueError("open PostgreSQL with chatbox.store.open_database")
        return await SqliteDatabase.open_file(Path(target))

    async def close(self) -> None:
        raise NotImplementedError

    def transaction(self) -> contextlib.AbstractAsyncContextManager[Any]:
        raise NotImplementedError

    def reading(self) -> contextlib.AbstractAsyncContextManager[Any]:
        raise NotImplementedError

    async def fetchone(self, sql: str, params: Iterable[Any] = ()) -> Any:
        raise NotImplementedError

    async def fetchall(self, sql: str, params: Iterable[Any] = ()) -> list[Any]:
        raise NotImplementedError

    async def checkpoint(self) -> None:
        """Move erased bytes out of the database's log, where the dialect has one to move."""
        raise NotImplementedError

    async def integrity_ok(self) -> bool:
        raise NotImplementedError

    async def tables(self) -> dict[str, list[tuple[str, str]]]:
        """Every table's (column, declared type) pairs (for the content registry's check)."""
        raise NotImplementedError

    async def writable(self) -> bool:
        """True when a write transaction can be taken and committed."""
        return await self.unwritable() is None

    async def unwritable(self) -> str | None:
        """Why a write transaction cannot be taken and committed now; None when it can."""
        try:
            async with asyncio.timeout(WRITE_CHECK_S):
                async with self.transaction() as tx:
                    await tx.execute("UPDATE meta SET value = value WHERE key = 'schema'")
        except TimeoutError:
            return f"a write did not finish in {WRITE_CHECK_S:g} s"
        except Exception as exc:
            return unreachable(exc) or f"{type(exc).__name__}: {exc}"
        return None


class SqliteDatabase(Database):
    """SQLite through aiosqlite: one connection, one serialized writer."""

    def __init__(
        self, conn: aiosqlite.Connection, path: Path, reader: aiosqlite.Connection | None = None
    ) -> None:
        super().__init__()
        self.conn = conn
        self.path = path
        # Search reads: on their own thread and connection, they never queue behind the
        # writer's statements (WAL lets them read the last commit while a write runs).
        self.reader = reader or conn
        self.snapshot = Snapshot(self, self.reader)

    @classmethod
    async def open_file(cls, path: Path) -> SqliteDatabase:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        conn = aiosqlite.Connection(lambda: _connect_sync(path), 64)
        await conn
        db = cls(conn, path)
        async with db.transaction() as tx:
            await apply_migrations(tx)
        reader = aiosqlite.Connection(lambda: _connect_sync(path, read_only=True), 64)
        await reader
        db.reader = reader
        db.snapshot = Snapshot(db, reader)
        return db

    async def close(self) -> None:
        if self.reader is not self.conn:
            await self.reader.close()
        await self.conn.close()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """BEGIN IMMEDIATE … COMMIT, rolled back on any error; one writer at a time."""
        t0 = time.perf_counter()  # waiting for the writer lock is part of a write's latency
        async with self._write_lock:
            await self._statement("BEGIN IMMEDIATE", "ROLLBACK")
            try:
                yield self.conn
            except BaseException:
                await self._statement("ROLLBACK")
                raise
            try:
                await self._statement("COMMIT")
            except Exception:  # a COMMIT that failed leaves the transaction open
                with contextlib.suppress(Exception):
                    await self._statement("ROLLBACK")
                raise
        self._timed("write", t0)

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[aiosqlite.Connection]:
        """A consistent multi-statement read: holds the writer lock (no write interleaves on
        this connection) inside a read transaction."""
        async with self._write_lock:
            await self._statement("BEGIN", "COMMIT")
            try:
                yield self.conn
            finally:
                await self._statement("COMMIT")

    async def _statement(self, sql: str, undo: str | None = None) -> None:
        """Run a transaction's BEGIN, COMMIT or ROLLBACK to its end even when the caller is
        cancelled meanwhile: the statement runs on in aiosqlite's thread regardless, and a
        BEGIN nobody ended left every later transaction refused ("cannot start a transaction
        within a transaction"). A cancelled BEGIN is ended with `undo`."""
        done = asyncio.ensure_future(self.conn.execute(sql))
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await done
                if undo is not None:
                    await self.conn.execute(undo)
            raise

    async def fetchone(self, sql: str, params: Iterable[Any] = ()) -> Any:
        t0 = time.perf_counter()
        async with self.conn.execute(sql, tuple(params)) as cur:
            row = await cur.fetchone()
        self._timed("read", t0)
        return row

    async def fetchall(self, sql: str, params: Iterable[Any] = ()) -> list[Any]:
        t0 = time.perf_counter()
        async with self.conn.execute(sql, tuple(params)) as cur:
            rows = list(await cur.fetchall())
        self._timed("read", t0)
        return rows

    async def checkpoint(self) -> None:
        """Copy the WAL into the database and truncate it (erased pages leave the WAL too)."""
        for attempt in range(CHECKPOINT_TRIES):
            try:
                async with (
                    self._write_lock,
                    self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)") as cur,
                ):
                    busy = await cur.fetchone()
            except sqlean.OperationalError as exc:
                # A read on this connection still had a statement open ("table is locked"):
                # the erasure itself is committed, only the WAL's copy waits.
                if "locked" not in str(exc):
                    raise
                await asyncio.sleep(0.05 * (attempt + 1))
                continue
            if busy is not None and busy[0]:  # another process (the CLI) was reading
                break
            return
        log.warning("the WAL checkpoint was blocked; erased pages leave the WAL at the next")

    async def integrity_ok(self) -> bool:
        row = await self.fetchone("PRAGMA integrity_check")
        return bool(row) and row[0] == "ok"

    async def tables(self) -> dict[str, list[tuple[str, str]]]:
        out: dict[str, list[tuple[str, str]]] = {}
        for row in await self.fetchall(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        ):
            cols = await self.fetchall(f"PRAGMA table_xinfo('{row['name']}')")
            out[row["name"]] = [(c["name"], c["type"] or "") for c in cols if not c["hidden"]]
        return out


class Snapshot(BatchedReads):
    """Reads on the SQLite database's second connection: each statement sees the last commit,
    and none waits for the writer's connection (for reads that need no uncommitted write)."""

    def __init__(self, db: Database, conn: aiosqlite.Connection) -> None:
        self.db = db
        self.conn = conn

    async def fetchone(self, sql: str, params: Iterable[Any] = ()) -> Any:
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    async def fetchall(self, sql: str, params: Iterable[Any] = ()) -> list[Any]:
        t0 = time.perf_counter()
        # One trip to the connection's thread (not three: execute, fetch, close): under load
        # each trip waits for a core and the GIL, up to tens of ms.
        rows = list(await self.conn.execute_fetchall(sql, tuple(params)))
        self.db._timed("snapshot", t0)
        return rows
