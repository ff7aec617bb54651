"""The counter store behind admission and the login throttle: token buckets, open-stream
leases and failed-attempt times.

`MemoryCounters` keeps them in this process (one front, the SQLite store). `PgCounters` keeps
them in PostgreSQL rows, so every front on the database sees and charges the same counters:
each change is one transaction that locks the rows it reads, and times come from the
database's clock, so the fronts' own clocks never disagree about a bucket. An open stream is
a lease that its front renews while it runs; a front that dies stops renewing, and its
streams stop counting once their lease runs out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from chatbox.store.pg import PgDatabase

log = logging.getLogger("chatbox.store")
STREAM_LEASE_S = 30.0  # how long a front's open streams count without it renewing them
MAX_KEYS = 100_000  # in-process failure keys kept (bounded memory under a spray of addresses)


@dataclass(frozen=True)
class Spend:
    """Take `amount` from the bucket `key`, which holds `capacity` and refills it per minute."""

    key: str
    capacity: float
    amount: float


@dataclass
class Taken:
    """What `take` did: `refused` names the bucket that lacked (or "streams"); nothing was
    taken then. `levels` are the buckets' levels (after the spend when taken)."""

    refused: str | None
    levels: dict[str, float]
    streams: int  # streams open before this one
    lease: str | None = None  # the new streams' lease (to `release`)


def refilled(level: float, capacity: float, elapsed_s: float) -> float:
    """A bucket's level `elapsed_s` after it was `level` (never above `capacity`)."""
    return min(capacity, level + max(0.0, elapsed_s) * capacity / 60.0)


class Counters(Protocol):
    """Limits' counters, shared by every front that uses the same store."""

    async def take(
        self, spends: Sequence[Spend], streams: tuple[str, int] | None, count: int = 1
    ) -> Taken:
        """All the spends and `count` streams of `streams` (key, most open at once) under one
        lease, or none."""
        ...

    async def give(self, key: str, capacity: float, amount: float) -> None:
        """Put `amount` back into a bucket (negative: charge more)."""
        ...

    async def release(self, lease: str) -> None:
        """Close an open stream."""
        ...

    def peek(self, key: str, capacity: float) -> float:
        """The bucket's level as last seen here (full when never seen)."""
        ...

    async def fail(self, counter: str, key: str, window_s: float) -> None:
        """Record one failed attempt of `key` in `counter`."""
        ...

    async def blocked_for(self, counter: str, key: str, limit: int, window_s: float) -> float:
        """Seconds until `key` may try again: 0 unless `limit` failures lie in the window."""
        ...

    async def forget(self, counter: str, key: str) -> None:
        """Drop `key`'s failures."""
        ...

    async def close(self) -> None: ...


@dataclass
class _Bucket:
    level: float
    updated: float


@dataclass
class MemoryCounters:
    """The counters of one process (the store is SQLite, or the counters are a test's)."""

    clock: Callable[[], float] = time.monotonic
    _buckets: dict[str, _Bucket] = field(default_factory=dict)
    _streams: dict[str, dict[str, int]] = field(default_factory=dict)  # key: lease: count
    _leases: dict[str, str] = field(default_factory=dict)  # lease: its streams key
    _fails: dict[str, deque[float]] = field(default_factory=dict)

    def _bucket(self, key: str, capacity: float) -> _Bucket:
        now = self.clock()
        b = self._buckets.get(key)
        if b is None:
            b = self._buckets[key] = _Bucket(capacity, now)
        b.level = refilled(b.level, capacity, now - b.updated)
        b.updated = now
        return b

    async def take(
        self, spends: Sequence[Spend], streams: tuple[str, int] | None, count: int = 1
    ) -> Taken:
        buckets = {s.key: self._bucket(s.key, s.capacity) for s in spends}
        levels = {k: b.level for k, b in buckets.items()}
        open_now = sum(self._streams.get(streams[0], {}).values()) if streams else 0
        for s in spends:
            if buckets[s.key].level < min(s.amount, s.capacity):
                return Taken(s.key, levels, open_now)
        if streams is not None and open_now + count > streams[1]:
            return Taken("streams", levels, open_now)
        for s in spends:
            buckets[s.key].level -= s.amount
        lease = None
        if streams is not None:
            lease = secrets.token_hex(8)
            self._streams.setdefault(streams[0], {})[lease] = count
            self._leases[lease] = streams[0]
        return Taken(None, {k: b.level for k, b in buckets.items()}, open_now, lease)

    async def give(self, key: str, capacity: float, amount: float) -> None:
        self._bucket(key, capacity).level += amount

    async def release(self, lease: str) -> None:
        key = self._leases.pop(lease, None)
        held = self._streams.get(key or "")
        if held is not None:
            held.pop(lease, None)
            if not held:
                del self._streams[key or ""]

    def peek(self, key: str, capacity: float) -> float:
        return self._bucket(key, capacity).level

    async def fail(self, counter: str, key: str, window_s: float) -> None:
        if len(self._fails) > MAX_KEYS:
            self._fails.clear()
        self._fails.setdefault(f"{counter}\x00{key}", deque(maxlen=1000)).append(self.clock())

    async def blocked_for(self, counter: str, key: str, limit: int, window_s: float) -> float:
        name = f"{counter}\x00{key}"
        now = self.clock()
        fails = self._fails.get(name)
        if not fails:
            return 0.0
        while fails and fails[0] <= now - window_s:
            fails.popleft()
        if not fails:
            del self._fails[name]
            return 0.0
        return fails[-limit] + window_s - now if len(fails) >= limit else 0.0

    async def forget(self, counter: str, key: str) -> None:
        self._fails.pop(f"{counter}\x00{key}", None)

    async def close(self) -> None:
        return None


_NOW = "extract(epoch FROM clock_timestamp())::float8"


def _text(key: str) -> str:
    """`key` as PostgreSQL text, which cannot hold NUL (a typed name may carry one)."""
    return key.replace("\x00", "\\0")


class PgCounters:
    """The counters as PostgreSQL rows, shared by every front on the database."""

    def __init__(self, db: PgDatabase, lease_s: float = STREAM_LEASE_S) -> None:
        self.db = db
        self.lease_s = lease_s
        self._seen: dict[str, tuple[float, float]] = {}  # key: (level, monotonic when seen)
        self._mine: set[str] = set()  # leases this front holds (and renews)
        self._renewer: asyncio.Task[None] | None = None

    def _saw(self, levels: dict[str, float]) -> None:
        now = time.monotonic()
        if len(self._seen) > MAX_KEYS:
            self._seen.clear()
        for key, level in levels.items():
            self._seen[key] = (level, now)

    async def take(
        self, spends: Sequence[Spend], streams: tuple[str, int] | None, count: int = 1
    ) -> Taken:
        async with self.db.pool.acquire() as conn, conn.transaction():
            levels: dict[str, float] = {}
            for s in sorted(spends, key=lambda s: s.key):  # one lock order: no deadlock
                levels[s.key] = await conn.fetchval(
                    "INSERT INTO limit_buckets AS b (key, level, updated)"
                    f" VALUES ($1, $2, {_NOW}) ON CONFLICT (key) DO UPDATE SET"
                    " level = LEAST($2, b.level + GREATEST(0, EXCLUDED.updated - b.updated)"
                    " * $2 / 60.0), updated = EXCLUDED.updated RETURNING level",
                    s.key,
                    float(s.capacity),
                )
            open_now = 0
            if streams is not None:
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", streams[0])
                open_now = await conn.fetchval(
                    f"SELECT count(*) FROM limit_leases WHERE key = $1 AND expires_at > {_NOW}",
                    streams[0],
                )
            refused = next(
                (s.key for s in spends if levels[s.key] < min(s.amount, s.capacity)), None
            )
            if refused is None and streams is not None and open_now + count > streams[1]:
                refused = "streams"
            if refused is not None:
                self._saw(levels)
                return Taken(refused, levels, open_now)
            for s in spends:
                levels[s.key] = await conn.fetchval(
                    "UPDATE limit_buckets SET level = level - $2 WHERE key = $1 RETURNING level",
                    s.key,
                    float(s.amount),
                )
            lease = None
            if streams is not None:
                lease = secrets.token_hex(8)
                await conn.execute(
                    f"DELETE FROM limit_leases WHERE key = $1 AND expires_at <= {_NOW}", streams[0]
                )
                # One row per stream: `lease`, then `lease/1`, `lease/2`... (released together).
                await conn.execute(
                    "INSERT INTO limit_leases (id, key, front, expires_at)"
                    f" SELECT CASE WHEN i = 0 THEN $1 ELSE $1 || '/' || i END, $2, $3, {_NOW} + $4"
                    " FROM generate_series(0, $5 - 1) AS i",
                    lease,
                    streams[0],
                    self.db.front,
                    float(self.lease_s),
                    count,
                )
        self._saw(levels)
        if lease is not None:
            self._mine.add(lease)
            self._renew_soon()
        return Taken(None, levels, open_now, lease)

    async def give(self, key: str, capacity: float, amount: float) -> None:
        level = await self.db.pool.fetchval(
            "UPDATE limit_buckets SET level = level + $2 WHERE key = $1 RETURNING level",
            key,
            float(amount),
        )
        if level is not None:
            self._saw({key: float(level)})

    async def release(self, lease: str) -> None:
        self._mine.discard(lease)
        await self.db.pool.execute(
            "DELETE FROM limit_leases WHERE id = $1 OR id LIKE $1 || '/%'", lease
        )

    def peek(self, key: str, capacity: float) -> float:
        seen = self._seen.get(key)
        if seen is None:
            return capacity
        return refilled(seen[0], capacity, time.monotonic() - seen[1])

    def _renew_soon(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(
                self._renew(), name="chatbox-stream-leases"
            )

    async def _renew(self) -> None:
        """Extend this front's leases every third of their term while it holds any."""
        while self._mine:
            await asyncio.sleep(self.lease_s / 3)
            try:
                await self.db.pool.execute(
                    f"UPDATE limit_leases SET expires_at = {_NOW} + $2 WHERE front = $1",
                    self.db.front,
                    float(self.lease_s),
                )
                # Lapsed leases go, a dead front's for users who never come back included.
                await self.db.pool.execute(
                    "DELETE FROM limit_leases WHERE id IN (SELECT id FROM limit_leases"
                    f" WHERE expires_at <= {_NOW} FOR UPDATE SKIP LOCKED)"
                )
            except Exception:  # the database is away: try again next term
                log.warning("could not renew this front's stream leases", exc_info=True)

    async def fail(self, counter: str, key: str, window_s: float) -> None:
        async with self.db.pool.acquire() as conn, conn.transaction():
            # Every failure past the window goes, of addresses never seen again included;
            # rows another front is deleting are left to it (no wait, no deadlock).
            await conn.execute(
                "DELETE FROM limit_failures WHERE seq IN (SELECT seq FROM limit_failures"
                f" WHERE counter = $1 AND at <= {_NOW} - $2 FOR UPDATE SKIP LOCKED)",
                counter,
                float(window_s),
            )
            await conn.execute(
                f"INSERT INTO limit_failures (counter, key, at) VALUES ($1, $2, {_NOW})",
                counter,
                _text(key),
            )

    async def blocked_for(self, counter: str, key: str, limit: int, window_s: float) -> float:
        wait = await self.db.pool.fetchval(
            f"SELECT at + $3 - {_NOW} FROM limit_failures"
            f" WHERE counter = $1 AND key = $2 AND at > {_NOW} - $3"
            " ORDER BY at DESC OFFSET $4 LIMIT 1",
            counter,
            _text(key),
            float(window_s),
            max(0, limit - 1),
        )
        return max(0.0, float(wait)) if wait is not None else 0.0

    async def forget(self, counter: str, key: str) -> None:
        await self.db.pool.execute(
            "DELETE FROM limit_failures WHERE counter = $1 AND key = $2", counter, _text(key)
        )

    async def close(self) -> None:
        """Stop renewing; this front's streams are over (the process is stopping)."""
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._renewer
        if self._mine:
            with contextlib.suppress(Exception):
                await self.db.pool.execute(
                    "DELETE FROM limit_leases WHERE split_part(id, '/', 1) = ANY($1::text[])",
                    list(self._mine),
                )
            self._mine.clear()
