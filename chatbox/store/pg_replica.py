"""Conversation reads on a PostgreSQL streaming replica, with read-your-writes.

Lists, a conversation's turns and search (`Database.conversation_reads`) go to the replica;
writes, and every read inside a write transaction, go to the primary. After each commit the
primary's WAL insert position is noted against the acting user (`db.actor`; a task with none:
the task), and that user's reads stay on the primary until the replica has replayed past it:
an LSN, not a time window, because it hands the reads back the moment the replica holds the
write and never too early, however far the replica lags. A replica that is unreachable, or
still short of where the primary was `max_lag_s` ago, serves nothing until a check (every
second) finds it well again; each read says where it went and why (`Database.on_read_route`:
the /metrics counter).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import asyncpg

from chatbox.store.db import WRITE_ALSO, BatchedReads, actor
from chatbox.store.pg import PgDatabase, _args, translate

log = logging.getLogger("chatbox.store")
CHECK_S = 1.0  # how often the replica's replay position and lag are checked
CONNECT_TIMEOUT_S = 2.0  # a replica that does not answer this fast is down
_LSN = "- '0/0'::pg_lsn"  # a pg_lsn as a byte position (numeric), comparable in Python
# What a replica that is going away or cannot serve a query raises: the read is retried on
# the primary (a recovery conflict cancels a standby's query with a serialization failure).
_GONE = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.SerializationError,
)


def _who() -> str | None:
    """Whose reads must see this task's writes: the acting user, else this task itself (a
    background job that writes and then reads back must see its write too)."""
    user = actor()
    if user is not None:
        return user
    task = asyncio.current_task()
    return f"task:{id(task)}" if task is not None else None


class ReplicaReads(BatchedReads):
    """The `Reader` of conversation reads: the replica's pool or the primary's, per read."""

    def __init__(self, primary: PgDatabase, pool: asyncpg.Pool, max_lag_s: float) -> None:
        self.primary = primary
        self.pool = pool
        self.max_lag_s = max_lag_s
        self.state = "down"  # up, lagging or down: only an "up" replica serves reads
        self.replayed = -1  # the replica's last replayed WAL position
        self.fresh: dict[str, int] = {}  # user -> WAL position their last write ended by
        self._samples: deque[tuple[float, int]] = deque()  # (when, primary's WAL position)
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def attach(cls, primary: PgDatabase, url: str, max_lag_s: float) -> ReplicaReads:
        """Serve `primary`'s conversation reads from the replica at `url` from now on."""
        pool = await asyncpg.create_pool(
            url, min_size=0, max_size=10, command_timeout=60, timeout=CONNECT_TIMEOUT_S
        )
        assert pool is not None
        reads = cls(primary, pool, max_lag_s)
        await reads.check()
        primary.after_write = reads.wrote
        primary.conversation_reads = reads
        primary.closers.append(reads.close)
        reads._task = asyncio.create_task(reads._watch())
        return reads

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                await self.pool.close()
        except TimeoutError:
            self.pool.terminate()

    # -- where the replica stands ---------------------------------------------------------
    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(CHECK_S)
            try:
                await self.check()
            except Exception:  # a check that breaks must not end the checking
                log.exception("checking the read replica failed")

    async def _replay_position(self) -> int | None:
        """The replica's replayed WAL position; None (and marked down) where it has none."""
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                found = await self.pool.fetchval(f"SELECT pg_last_wal_replay_lsn() {_LSN}")
        except _GONE as exc:
            self._set("down", f"unreachable ({type(exc).__name__}: {exc})")
            return None
        if found is None:
            self._set("down", "not a standby (pg_last_wal_replay_lsn() is null)")
            return None
        self.replayed = max(self.replayed, int(found))
        return self.replayed

    async def check(self) -> None:
        """Read the replica's replay position and the primary's; decide up, lagging or down."""
        try:
            current = int(await self.primary.pool.fetchval(f"SELECT pg_current_wal_lsn() {_LSN}"))
        except _GONE:
            return  # the primary's own trouble: every read fails there anyway
        if await self._replay_position() is None:
            return
        now = time.monotonic()
        self._samples.append((now, current))
        then = now - self.max_lag_s
        while len(self._samples) > 1 and self._samples[1][0] <= then:
            self._samples.popleft()
        at, wanted = self._samples[0]  # the newest sample at least max_lag_s old
        if at <= then and wanted > self.replayed:
            self._set("lagging", f"more than {self.max_lag_s:g} s behind the primary")
        else:
            self._set("up", "")
        self.fresh = {user: lsn for user, lsn in self.fresh.items() if lsn > self.replayed}

    def _set(self, state: str, why: str) -> None:
        if state == self.state:
            return
        if state == "up":
            log.info("read replica is serving conversation reads again")
        else:
            log.warning("read replica %s: conversation reads go to the primary", why)
        self.state = state

    async def wrote(self, conn: asyncpg.Connection) -> None:
        """After a commit: the reads of the users it is attributed to (the acting user, and
        any named by `also_for`) wait for the replica to pass this point.

        The insert position read after the commit is at or past the commit record's end."""
        users = {*(WRITE_ALSO.get() or ()), *filter(None, [_who()])}
        if users:
            lsn = int(await conn.fetchval(f"SELECT pg_current_wal_insert_lsn() {_LSN}"))
            for user in users:
                self.fresh[user] = max(lsn, self.fresh.get(user, 0))

    # -- reads ----------------------------------------------------------------------------
    async def _route(self) -> tuple[bool, str]:
        """(on the replica?, why) for the next read."""
        if WRITE_ALSO.get() is not None:
            return False, "in_write"
        if self.state != "up":
            return False, self.state
        user = _who()
        need = self.fresh.get(user, -1) if user is not None else -1
        if need > self.replayed:
            replayed = await self._replay_position()
            if replayed is None:
                return False, "down"
            if need > replayed:
                return False, "own_write"
        return True, "replica"

    def _told(self, served_by: str, reason: str) -> None:
        if self.primary.on_read_route is not None:
            self.primary.on_read_route(served_by, reason)

    async def _read(self, kind: str, sql: str, params: Iterable[Any]) -> Any:
        t0 = time.perf_counter()
        query, names = translate(sql)
        args = _args(names, params)
        on_replica, why = await self._route()
        if on_replica:
            try:
                found = await getattr(self.pool, kind)(query, *args)
            except _GONE as exc:
                self._set("down", f"failed a read ({type(exc).__name__}: {exc})")
                why = "error"
            else:
                self._told("replica", why)
                self.primary._timed("read", t0)
                return found
        found = await getattr(self.primary.pool, kind)(query, *args)
        self._told("primary", why)
        self.primary._timed("read", t0)
        return found

    async def fetchone(self, sql: str, params: Iterable[Any] = ()) -> Any:
        return await self._read("fetchrow", sql, params)

    async def fetchall(self, sql: str, params: Iterable[Any] = ()) -> list[Any]:
        return list(await self._read("fetch", sql, params))
