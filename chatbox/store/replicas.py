"""The replica table of router mode: which remote engines an operator added (not their
health), which replicas are drained, and, for several fronts on one PostgreSQL database,
where routed keys went off their hash order and each front's answers on OpenAI-kind
replicas (the placement and load methods do nothing on SQLite, where there is one front)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from chatbox.store.db import Database

if TYPE_CHECKING:
    from chatbox.store.pg import PgDatabase

_NOW = "extract(epoch FROM clock_timestamp())::float8"
_ROWS = (
    "SELECT r.url, r.kind, r.slots, r.models, r.secret, r.added_at,"
    " CASE WHEN d.url IS NULL THEN 0 ELSE 1 END AS draining"
    " FROM replicas r LEFT JOIN replica_drains d ON d.url = r.url"
)


@dataclass(frozen=True)
class ReplicaRow:
    url: str
    kind: str  # chatbox | openai
    slots: int  # answers at once (0: ask the replica; an OpenAI server's must be configured)
    models: tuple[str, ...]  # for an OpenAI server: the models it serves (empty: ask it)
    secret: str | None
    draining: bool
    added_at: float

    @classmethod
    def from_row(cls, row: Any) -> ReplicaRow:
        models = tuple(m for m in str(row["models"]).split(",") if m)
        return cls(
            row["url"],
            row["kind"],
            int(row["slots"]),
            models,
            row["secret"],
            bool(row["draining"]),
            float(row["added_at"]),
        )


class ReplicaRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def list(self) -> list[ReplicaRow]:
        rows = await self.db.fetchall(_ROWS + " ORDER BY r.added_at, r.url")
        return [ReplicaRow.from_row(r) for r in rows]

    async def drains(self) -> set[str]:
        """The URLs of every drained replica (table and command-line ones)."""
        return {r["url"] for r in await self.db.fetchall("SELECT url FROM replica_drains")}

    async def upsert(
        self,
        url: str,
        kind: str,
        slots: int = 0,
        models: tuple[str, ...] = (),
        secret: str | None = None,
    ) -> ReplicaRow:
        """Add a replica, or change how one is reached (it stays where it was in the list)."""
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO replicas (url, kind, slots, models, secret, added_at)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(url) DO UPDATE SET kind = excluded.kind,"
                " slots = excluded.slots, models = excluded.models, secret = excluded.secret",
                (url, kind, slots, ",".join(models), secret, time.time()),
            )
            await tx.execute("DELETE FROM replica_drains WHERE url = ?", (url,))
        row = await self.db.fetchone(_ROWS + " WHERE r.url = ?", (url,))
        return ReplicaRow.from_row(row)

    async def remove(self, url: str) -> bool:
        """Remove a table replica (and its drain: a command-line one's stays, as other
        fronts still name it); False when the table does not hold it."""
        async with self.db.transaction() as tx:
            cur = await tx.execute("DELETE FROM replicas WHERE url = ?", (url,))
            if not cur.rowcount:
                return False
            await tx.execute("DELETE FROM replica_drains WHERE url = ?", (url,))
            return True

    async def set_draining(self, url: str, draining: bool) -> None:
        """Drain (or undrain) a replica by its URL, whether or not the table holds it."""
        async with self.db.transaction() as tx:
            if draining:
                await tx.execute(
                    "INSERT INTO replica_drains (url, at) VALUES (?, ?)"
                    " ON CONFLICT(url) DO NOTHING",
                    (url, time.time()),
                )
            else:
                await tx.execute("DELETE FROM replica_drains WHERE url = ?", (url,))

    # -- several fronts (PostgreSQL) ---------------------------------------------------------
    def _pg(self) -> PgDatabase | None:
        """The PostgreSQL database, or None on SQLite. These small idempotent writes skip
        the store's one write lock, as job claims do."""
        if self.db.dialect != "postgresql":
            return None
        from chatbox.store.pg import PgDatabase

        assert isinstance(self.db, PgDatabase)
        return self.db

    async def placement(self, key: str) -> str | None:
        """The replica a routed key last went to off its hash order, if any front noted it."""
        pg = self._pg()
        if pg is None:
            return None
        url = await pg.pool.fetchval("SELECT url FROM replica_placements WHERE key = $1", key)
        return None if url is None else str(url)

    async def place(self, key: str, url: str) -> None:
        pg = self._pg()
        if pg is None:
            return
        await pg.pool.execute(
            f"INSERT INTO replica_placements (key, url, at) VALUES ($1, $2, {_NOW})"
            " ON CONFLICT (key) DO UPDATE SET url = excluded.url, at = excluded.at",
            key,
            url,
        )

    async def forget_placements(self, older_than_s: float) -> int:
        """Drop placements not renewed for a while (their replicas' caches are long cold)."""
        pg = self._pg()
        if pg is None:
            return 0
        status = await pg.pool.execute(
            f"DELETE FROM replica_placements WHERE at < {_NOW} - $1", float(older_than_s)
        )
        return int(str(status).rsplit(" ", 1)[-1] or 0)

    async def share_loads(
        self, loads: dict[tuple[str, str], int], fresh_s: float
    ) -> dict[tuple[str, str], int]:
        """Publish this front's answers per (replica URL, model) and return the other live
        fronts' (rows renewed within `fresh_s`; a dead front's lapse with it)."""
        pg = self._pg()
        if pg is None:
            return {}
        front = pg.front
        async with pg.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                f"DELETE FROM replica_loads WHERE front = $1 OR at < {_NOW} - $2",
                front,
                float(fresh_s) * 10,
            )
            await conn.executemany(
                f"INSERT INTO replica_loads (front, url, model, answers, at)"
                f" VALUES ($1, $2, $3, $4, {_NOW})",
                [(front, url, model, n) for (url, model), n in loads.items() if n > 0],
            )
        rows = await pg.pool.fetch(
            "SELECT url, model, sum(answers)::bigint AS answers FROM replica_loads"
            f" WHERE front <> $1 AND at > {_NOW} - $2 GROUP BY url, model",
            front,
            float(fresh_s),
        )
        return {(r["url"], r["model"]): int(r["answers"]) for r in rows}
