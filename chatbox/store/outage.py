"""Telling a store that cannot be reached from a statement that failed.

An outage (PostgreSQL stopped, restarting, cut off or out of connections; SQLite held by
another writer past the busy timeout) is the client's cue to retry later, not a bug: callers
answer it with 503 and one line in the log instead of a traceback.
"""

from __future__ import annotations

import logging
import sys
from types import TracebackType

RETRY_AFTER_S = 5  # what a client is told to wait before trying again

# SQLite's transient errors, by message: another process holds the database.
_SQLITE_TRANSIENT = ("database is locked", "database table is locked", "database is busy")


def _through_asyncpg(tb: TracebackType | None) -> bool:
    """Whether a traceback passes through asyncpg (its socket errors are the store's)."""
    while tb is not None:
        if "asyncpg" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


def _asyncpg_reason(exc: BaseException) -> str | None:
    if "asyncpg" not in sys.modules:  # no asyncpg error can exist before it is imported
        return None
    import asyncpg

    if isinstance(exc, asyncpg.CannotConnectNowError):
        return "the database is starting up or shutting down"
    if isinstance(exc, asyncpg.AdminShutdownError | asyncpg.CrashShutdownError):
        return "the database server shut down"
    if isinstance(exc, asyncpg.TooManyConnectionsError):
        return "the database has no free connections"
    if isinstance(exc, asyncpg.PostgresConnectionError | asyncpg.ConnectionDoesNotExistError):
        return "the connection to the database was lost"
    if isinstance(exc, asyncpg.InterfaceError) and "connection is closed" in str(exc):
        return "the connection to the database was lost"
    if isinstance(exc, ConnectionRefusedError) and _through_asyncpg(exc.__traceback__):
        return "the database refused the connection"
    if isinstance(exc, OSError | TimeoutError) and _through_asyncpg(exc.__traceback__):
        return f"the database could not be reached ({type(exc).__name__})"
    return None


def _sqlite_reason(exc: BaseException) -> str | None:
    kind = type(exc)
    if kind.__name__ != "OperationalError" or not kind.__module__.startswith(("sqlite3", "sqlean")):
        return None
    text = str(exc).lower()
    return "the database is locked by another writer" if text in _SQLITE_TRANSIENT else None


def unreachable(exc: BaseException) -> str | None:
    """Why the store could not be reached, where `exc` (or an exception it was raised from
    or while handling) says so; None for any other failure."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        reason = _asyncpg_reason(current) or _sqlite_reason(current)
        if reason is not None:
            return reason
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return None


class OneLine(logging.Filter):
    """A library's log record of an outage as one line: its reason, not its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        reason = unreachable(exc) if exc is not None else None
        if reason is not None:
            record.msg = f"{record.getMessage()} ({reason})"
            record.args, record.exc_info, record.exc_text = None, None, None
        return True


def quiet_outages(target: logging.Filterer) -> None:
    """Log the outage records that pass `target` (a logger, or a handler: every logger's
    records) in one line each; asyncpg's pool logs a traceback for every failed reconnect."""
    if not any(isinstance(f, OneLine) for f in target.filters):
        target.addFilter(OneLine())
