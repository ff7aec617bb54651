"""Copying a SQLite store into an empty PostgreSQL one, verified table by table.

Every table of the PostgreSQL schema is copied row for row (its full-text tables are rebuilt
by their triggers, `meta` and `migrations` are the target's own), identity sequences are moved
past the copied keys, and each table's rows are then counted and checksummed on both sides.
A conversation deleted but not yet erased goes in live and is deleted again once its turns
are in (the triggers refuse turns into a deleted conversation).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from chatbox.store.db import Database, SqliteDatabase

# Parents before children (foreign keys); every other table of the schema follows in any order.
ORDER = (
    "users",
    "conversations",
    "turns",
    "drafts",
    "workspaces",
    "documents",
    "chunks",
    "memories",
    "shares",
    "eval_runs",
)
SKIP = frozenset({"meta", "migrations", "turn_fts", "chunk_fts"})  # the target's own, or derived
IDENTITY = {
    "turns": "seq",
    "memories": "seq",
    "documents": "seq",
    "chunks": "seq",
    "summaries": "seq",
    "feedback": "seq",
    "audit_log": "id",
    "eval_results": "rowid",
    "canary_events": "seq",
}
PAGE = 1000


class NotEmptyError(ValueError):
    """The target already holds a store's data."""


@dataclass(frozen=True)
class TableCopy:
    """One table: rows and checksum on each side (equal when the copy is whole)."""

    name: str
    rows: int
    copied: int
    checksum: str
    copied_checksum: str

    @property
    def ok(self) -> bool:
        return self.rows == self.copied and self.checksum == self.copied_checksum


def _canon(value: Any) -> bytes:
    """A value as both stores return it: numbers as floats (REAL columns may hold integers
    in SQLite), bytes as they are, text as UTF-8."""
    if value is None:
        return b"\x00"
    if isinstance(value, int | float):
        return b"n" + float(value).hex().encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return b"b" + bytes(value)
    return b"s" + str(value).encode()


def _row_hash(row: Any) -> int:
    h = hashlib.sha256()
    for value in row:
        part = _canon(value)
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return int.from_bytes(h.digest()[:16], "little")


async def _pages(db: Database, table: str, cols: list[str]) -> AsyncIterator[list[Any]]:
    """A table's rows in pages (in primary-key order where the key is `rowid`/`seq`/`id`)."""
    select = f"SELECT {', '.join(cols)} FROM {table}"
    if isinstance(db, SqliteDatabase):
        async with db.conn.execute(select) as cur:
            while rows := list(await cur.fetchmany(PAGE)):
                yield rows
        return
    async with db.reading() as tx:
        cur = await tx.execute(select)
        while rows := await cur.fetchmany(PAGE):
            yield rows


async def _checksum(db: Database, table: str, cols: list[str]) -> tuple[int, str]:
    """(rows, an order-free checksum of them: the sum of each row's hash, mod 2**128)."""
    n, total = 0, 0
    async for rows in _pages(db, table, cols):
        n += len(rows)
        total = (total + sum(_row_hash(r) for r in rows)) % (1 << 128)
    return n, f"{total:032x}"


async def copy_store(source: Database, target: Database) -> list[TableCopy]:
    """Copy every table of `source` (SQLite) into `target` (PostgreSQL, freshly migrated and
    empty); the per-table counts and checksums of both, after the copy."""
    if source.dialect != "sqlite" or target.dialect != "postgresql":
        raise ValueError("a copy goes from SQLite to PostgreSQL")
    if (await target.fetchone("SELECT count(*) FROM users"))[0]:
        raise NotEmptyError("the PostgreSQL database already holds users; give an empty one")
    schema = await target.tables()
    tables = [t for t in ORDER if t in schema]
    tables += sorted(t for t in schema if t not in SKIP and t not in tables)
    columns = {t: [c for c, _ in schema[t]] for t in tables}
    deleted: list[tuple[float, str]] = []
    async with target.transaction() as tx:
        for table in tables:
            cols = columns[table]
            insert = (
                f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})"
            )
            async for rows in _pages(source, table, cols):
                values = [list(r) for r in rows]
                if table == "conversations":  # in live; deleted again below
                    at = cols.index("deleted_at")
                    for v in values:
                        if v[at] is not None:
                            deleted.append((v[at], v[cols.index("id")]))
                            v[at] = None
                await tx.executemany(insert, values)
        await tx.executemany("UPDATE conversations SET deleted_at = ? WHERE id = ?", deleted)
        for table, key in IDENTITY.items():
            if table in schema:
                await tx.execute(
                    f"SELECT setval(pg_get_serial_sequence('{table}', '{key}'),"
                    f" coalesce((SELECT max({key}) FROM {table}), 0) + 1, false)"
                )
    out = []
    for table in tables:
        count, checksum = await _checksum(source, table, columns[table])
        copied, copied_checksum = await _checksum(target, table, columns[table])
        out.append(TableCopy(table, count, copied, checksum, copied_checksum))
    return out
