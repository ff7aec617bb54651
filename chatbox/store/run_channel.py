"""Fronts sharing one PostgreSQL database: which of them are alive, and a notice channel
between them (`chatbox.chat.running.fronts` speaks over it about running answers).

A front is alive while its channel's connection holds a session advisory lock named by the
front's key: a front that dies (killed, crashed, cut off) loses the lock with its connection,
and every other front sees it gone in `pg_locks` at once. A front whose connection drops takes
the same lock again when it reconnects, so the others wait a grace before taking it for dead
(`chatbox.chat.running.fronts`). Messages are JSON objects sent with
`NOTIFY`; one too long for a notice's payload travels in parts that the receivers join.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("chatbox.store")
RUNS_CHANNEL = "chatbox_runs"
FRONT_LOCK = 0x66726E74  # the advisory lock class of the fronts' liveness locks ("frnt")
PART_CHARS = 1700  # characters of a message per notice: at most 4 bytes each, under 8,000
# A statement on the channel's connection that gets no reply (a cut-off network) fails after
# this long, so no send or liveness check waits on it for ever.
COMMAND_TIMEOUT_S = 10.0
# How long a reconnect waits for its own lock, still held by the dropped session on its way
# out, before it tries again: a fraction of the other fronts' grace (chat/running/fronts.py).
LOCK_WAIT_S = 1.0

Message = dict[str, Any]
Listener = Callable[[Message], None]


class RunChannel:
    """A front's link to the other fronts on its database: `front` names this one."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.key = secrets.randbits(31) or 1
        self.front = str(self.key)
        self._conn: Any = None  # an asyncpg connection, once open
        self._send_lock = asyncio.Lock()  # one notice at a time: parts stay in order
        self._listeners: list[Listener] = []
        self._parts: dict[tuple[str, int], list[str]] = {}
        self._seq = 0
        self._closing = False
        self._reopening: asyncio.Task[None] | None = None
        # When this front last saw every front's lock (it connected): a front missing since
        # before then may only have been out of sight.
        self.connected_since = time.monotonic()

    async def open(self) -> RunChannel:
        import asyncpg  # loads only where PostgreSQL is used

        conn = await asyncpg.connect(self.url, command_timeout=COMMAND_TIMEOUT_S)
        try:
            taken = await conn.fetchval("SELECT pg_try_advisory_lock($1, $2)", FRONT_LOCK, self.key)
            if not taken:  # a dropped session of this front's, still ending: taken when it goes
                with contextlib.suppress(TimeoutError):
                    await conn.execute(
                        "SELECT pg_advisory_lock($1, $2)", FRONT_LOCK, self.key, timeout=LOCK_WAIT_S
                    )
                    taken = True
            if not taken:
                raise ConnectionError("this front's liveness lock is still held")
            await conn.add_listener(RUNS_CHANNEL, self._on_notice)
        except BaseException:
            await conn.close()
            raise
        conn.add_termination_listener(self._on_lost)
        self._conn = conn
        self.connected_since = time.monotonic()
        return self

    def _on_lost(self, conn: object) -> None:
        """The connection (and with it the lock) is gone: take the same lock again, within
        the grace the other fronts give before they take this one for dead."""
        if conn is not self._conn:  # an earlier connection's, already replaced
            return
        self._conn = None
        if self._closing or self._reopening is not None:
            return
        log.warning(
            "lost the database connection that shows this front alive; reconnecting "
            "(other fronts store its running answers as interrupted if it is away too long)"
        )
        self._reopening = asyncio.ensure_future(self._reopen())

    async def _reopen(self) -> None:
        try:
            delay = 0.2
            while not self._closing:
                await asyncio.sleep(delay)
                try:
                    await self.open()
                    log.warning("reconnected: this front shows itself alive again")
                    return
                except Exception as exc:  # still away: try again
                    log.warning("could not reconnect to the database: %s", exc)
                delay = min(delay * 2, 2.0)
        finally:
            self._reopening = None

    async def close(self) -> None:
        self._closing = True
        if self._reopening is not None:
            self._reopening.cancel()
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
            self._conn = None

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def unsubscribe(self, listener: Listener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    async def live_fronts(self) -> set[str]:
        """The fronts on this database whose process holds its liveness lock now;
        ConnectionError while this front's own connection is away (it cannot tell)."""
        conn = self._conn
        if conn is None:
            raise ConnectionError("this front is not connected to the database")
        async with self._send_lock:
            try:
                rows = await conn.fetch(
                    "SELECT objid FROM pg_locks WHERE locktype = 'advisory' AND classid = $1"
                    " AND objsubid = 2 AND granted AND database ="
                    " (SELECT oid FROM pg_database WHERE datname = current_database())",
                    FRONT_LOCK,
                )
            except Exception:
                self._closed(conn)
                raise
        return {str(r["objid"]) for r in rows}

    async def send(self, message: Message) -> None:
        """Tell every other front; a message is lost (logged) if the database is away."""
        conn = self._conn
        if conn is None:
            return
        text = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
        parts = [text[i : i + PART_CHARS] for i in range(0, len(text), PART_CHARS)] or [""]
        try:
            async with self._send_lock:
                self._seq += 1
                for n, part in enumerate(parts):
                    notice = f"{self.front} {self._seq} {n} {len(parts)} {part}"
                    await conn.execute("SELECT pg_notify($1, $2)", RUNS_CHANNEL, notice)
        except Exception as exc:  # asyncpg's errors, a lost connection
            log.warning("could not notify the other fronts: %s", exc)
            self._closed(conn)

    def _closed(self, conn: Any) -> None:
        """Reconnect if `conn` is closed: a connection cut while a statement ran on it is
        closed without calling its termination listener."""
        if conn.is_closed():
            self._on_lost(conn)

    def _on_notice(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            front, seq, n, total, part = payload.split(" ", 4)
            key = (front, int(seq))
            index, count = int(n), int(total)
        except ValueError:
            return
        if front == self.front:
            return
        got = self._parts.setdefault(key, [])
        if len(got) != index:  # a part went missing: drop the whole message
            self._parts.pop(key, None)
            return
        got.append(part)
        if len(got) < count:
            return
        del self._parts[key]
        try:
            message = json.loads("".join(got))
        except ValueError:
            return
        for listener in list(self._listeners):
            try:
                listener(message)
            except Exception:  # one listener's bug must not silence the others
                log.exception("a run notice's listener failed")
