"""The PostgreSQL database: the store's repositories run on it as on SQLite.

Repositories write SQL with `?` (or `:name`) placeholders, as for SQLite; each statement is
translated once to asyncpg's `$n` form. Writes take one advisory lock, so they are serialized
across every front as SQLite's single writer serializes them in one process. Vectors are plain
rows here (no pgvector): the fronts' in-RAM indexes answer nearest-neighbour queries, and
a `NOTIFY` on `chatbox_vectors` after each vector write makes the other fronts reload the
partition it touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from functools import lru_cache
from typing import Any

import asyncpg

from chatbox.store.content import content_columns
from chatbox.store.db import WRITE_ALSO, Database
from chatbox.store.outage import quiet_outages
from chatbox.store.pg_migrations import apply_postgresql_migrations
from chatbox.store.run_channel import RunChannel
from chatbox.store.vector_feed import VectorChange, VectorFeed

log = logging.getLogger("chatbox.store")
WRITE_LOCK = 0x63686174  # the advisory lock every write transaction holds ("chat")
MIGRATE_LOCK = 0x6D696772  # held while migrations run, so two fronts never apply one twice
VECTOR_CHANNEL = "chatbox_vectors"
CLOSE_WAIT_S = 5.0
_ROWS = re.compile(r"^\s*(SELECT|WITH|VALUES|SHOW)\b|\bRETURNING\b", re.IGNORECASE)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_url(target: object) -> bool:
    """True for a PostgreSQL connection URL (the store's other target is a SQLite path)."""
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


@lru_cache(maxsize=4096)
def translate(sql: str) -> tuple[str, tuple[str, ...] | None]:
    """`sql` with `?` or `:name` placeholders as `$n`; the names in `$n` order (None: `?`).

    Quoted text and identifiers are copied as they are, and `::` casts are left alone."""
    out: list[str] = []
    names: list[str] = []
    positional = 0
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c in "'\"":
            end = sql.find(c, i + 1)
            end = n - 1 if end < 0 else end
            out.append(sql[i : end + 1])
            i = end + 1
        elif c == "?":
            positional += 1
            out.append(f"${positional}")
            i += 1
        elif c == ":" and i + 1 < n and sql[i + 1] == ":":
            out.append("::")
            i += 2
        elif c == ":" and (m := _NAME.match(sql, i + 1)) is not None:
            name = m.group(0)
            if name not in names:
                names.append(name)
            out.append(f"${names.index(name) + 1}")
            i = m.end()
        else:
            out.append(c)
            i += 1
    if positional and names:
        raise ValueError("a statement mixes ? and :name placeholders")
    return "".join(out), (tuple(names) if names else None)


def _text(value: Any) -> Any:
    """PostgreSQL's text cannot hold U+0000 (SQLite's can): it is stored as U+FFFD, the
    character that already stands for what was not text."""
    if isinstance(value, str) and "\x00" in value:
        return value.replace("\x00", "\ufffd")
    return value


def _args(names: tuple[str, ...] | None, params: Any) -> list[Any]:
    if names is None:
        return [_text(v) for v in params or ()]
    assert isinstance(params, Mapping), "named placeholders need a mapping"
    return [_text(params[name]) for name in names]


async def keep_content_out_of_statistics(conn: asyncpg.Connection) -> None:
    """ANALYZE (autovacuum's too) samples no content column: its sampled values would sit in
    `pg_statistic` after their rows are erased and vacuumed away. Every column the content
    registry declares is set to `STATISTICS 0`; samples an earlier ANALYZE took of one are
    dropped by setting its type again (to the same type: no rewrite)."""
    rows = await conn.fetch(
        "SELECT c.relname, a.attname, a.attstattarget,"
        " format_type(a.atttypid, a.atttypmod) AS type,"
        " EXISTS (SELECT 1 FROM pg_statistic s WHERE s.starelid = c.oid"
        " AND s.staattnum = a.attnum) AS sampled"
        " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')"
        " AND a.attnum > 0 AND NOT a.attisdropped"
    )
    content = set(content_columns())
    for row in rows:
        if (row["relname"], row["attname"]) not in content:
            continue
        column = f'"{row["relname"]}" ALTER COLUMN "{row["attname"]}"'
        if row["attstattarget"] != 0:
            await conn.execute(f"ALTER TABLE {column} SET STATISTICS 0")
        if row["sampled"]:
            await conn.execute(f"ALTER TABLE {column} TYPE {row['type']}")


class Cursor:
    """What a statement returned, read like an aiosqlite cursor."""

    lastrowid = None  # PostgreSQL has no rowid: statements say `RETURNING seq`

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        self._rows = rows
        self._at = 0
        self.rowcount = rowcount

    async def fetchone(self) -> Any:
        if self._at >= len(self._rows):
            return None
        self._at += 1
        return self._rows[self._at - 1]

    async def fetchmany(self, size: int) -> list[Any]:
        part = self._rows[self._at : self._at + size]
        self._at += len(part)
        return part

    async def fetchall(self) -> list[Any]:
        return await self.fetchmany(len(self._rows))


class _Result:
    """A statement run on first use, awaited or entered (`async with tx.execute(...)`)."""

    def __init__(self, tx: Tx, sql: str, params: Any) -> None:
        self._tx, self._sql, self._params = tx, sql, params

    def __await__(self) -> Any:
        return self._tx.run(self._sql, self._params).__await__()

    async def __aenter__(self) -> Cursor:
        return await self._tx.run(self._sql, self._params)

    async def __aexit__(self, *exc: object) -> None:
        return None


class Tx:
    """One connection inside a transaction, with aiosqlite's `execute`/`executemany`."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Any = ()) -> _Result:
        return _Result(self, sql, params)

    async def run(self, sql: str, params: Any = ()) -> Cursor:
        query, names = translate(sql)
        args = _args(names, params)
        if _ROWS.search(query):
            rows = list(await self.conn.fetch(query, *args))
            return Cursor(rows, len(rows))
        status = await self.conn.execute(query, *args)
        last = status.rsplit(" ", 1)[-1] if status else ""
        return Cursor([], int(last) if last.isdigit() else -1)

    async def executemany(self, sql: str, seq: Iterable[Any]) -> None:
        query, names = translate(sql)
        rows = [_args(names, p) for p in seq]
        if rows:
            await self.conn.executemany(query, rows)


class _NotifyingFeed(VectorFeed):
    """Local listeners are told at once; other fronts are told to reload the partition."""

    def __init__(self, db: PgDatabase) -> None:
        super().__init__()
        self._db = db

    async def publish(self, change: VectorChange) -> None:
        await super().publish(change)
        if (change.rowids or change.deleted) and not change.reload:
            await self._db.notify_vectors(change.table, change.user_id)


class PgDatabase(Database):
    """An asyncpg pool. Reads go straight through; writes go through `transaction()`."""

    dialect = "postgresql"

    def __init__(self, pool: asyncpg.Pool, url: str) -> None:
        super().__init__()
        self.pool = pool
        self.url = url
        self.front = secrets.token_hex(8)  # tells this front's notices from others'
        self.vector_changes = _NotifyingFeed(self)
        self._listener: asyncpg.Connection | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # Run on the write's connection after each commit (a read replica notes its LSN).
        self.after_write: Callable[[asyncpg.Connection], Awaitable[None]] | None = None
        self.closers: list[Callable[[], Awaitable[None]]] = []

    @classmethod
    async def connect(cls, url: str) -> PgDatabase:
        quiet_outages(logging.getLogger("asyncpg.pool"))
        pool = await asyncpg.create_pool(url, min_size=1, max_size=10, command_timeout=60)
        assert pool is not None
        db = cls(pool, url)
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATE_LOCK)
            await apply_postgresql_migrations(Tx(conn))
            await keep_content_out_of_statistics(conn)
        await db._listen()
        db.runs = await RunChannel(url).open()
        return db

    async def _listen(self) -> None:
        self._listener = await asyncpg.connect(self.url)
        await self._listener.add_listener(VECTOR_CHANNEL, self._on_notice)

    def _on_notice(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            notice = json.loads(payload)
        except ValueError:
            return
        if notice.get("front") == self.front:
            return
        change = VectorChange(str(notice["table"]), str(notice["user"]), reload=True)
        task = asyncio.ensure_future(self.vector_changes.publish(change))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def notify_vectors(self, table: str, user_id: str) -> None:
        payload = json.dumps({"front": self.front, "table": table, "user": user_id})
        await self.pool.execute("SELECT pg_notify($1, $2)", VECTOR_CHANNEL, payload)

    async def close(self) -> None:
        for close in self.closers:
            await close()
        if self.runs is not None:
            await self.runs.close()
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close()
        try:  # a connection still held (an abandoned request) must not hold up a stop
            async with asyncio.timeout(CLOSE_WAIT_S):
                await self.pool.close()
        except TimeoutError:
            log.warning("PostgreSQL connections were still in use at close; terminated")
            self.pool.terminate()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        """A transaction holding the one write lock (this front's, then every front's)."""
        t0 = time.perf_counter()
        async with self._write_lock, self.pool.acquire() as conn:
            inside = WRITE_ALSO.set([])  # and reads in here go to the primary
            try:
                async with conn.transaction():
                    await conn.execute("SELECT pg_advisory_xact_lock($1)", WRITE_LOCK)
                    yield Tx(conn)
                if self.after_write is not None:
                    await self.after_write(conn)
            finally:
                WRITE_ALSO.reset(inside)
        self._timed("write", t0)

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[Tx]:
        """A consistent multi-statement read (one snapshot)."""
        async with (
            self.pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            yield Tx(conn)

    async def fetchone(self, sql: str, params: Iterable[Any] = ()) -> Any:
        t0 = time.perf_counter()
        query, names = translate(sql)
        row = await self.pool.fetchrow(query, *_args(names, params))
        self._timed("read", t0)
        return row

    async def fetchall(self, sql: str, params: Iterable[Any] = ()) -> list[Any]:
        t0 = time.perf_counter()
        query, names = translate(sql)
        rows = list(await self.pool.fetch(query, *_args(names, params)))
        self._timed("read", t0)
        return rows

    async def checkpoint(self) -> None:
        """Nothing to copy: PostgreSQL's WAL and dead rows are its own (see docs/scaling.md)."""

    async def integrity_ok(self) -> bool:
        return await self.fetchone("SELECT 1") is not None

    async def tables(self) -> dict[str, list[tuple[str, str]]]:
        rows = await self.fetchall(
            "SELECT table_name, column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position"
        )
        out: dict[str, list[tuple[str, str]]] = {}
        for r in rows:
            out.setdefault(r["table_name"], []).append((r["column_name"], r["data_type"]))
        return out
