"""Claims on background jobs (memory extraction, indexing, retention sweeps), so that of
several fronts on one PostgreSQL database exactly one does each.

A claim is a row per job name: a front takes it with `SELECT … FOR UPDATE SKIP LOCKED` when
no other front holds it (its `until` has passed) and holds it until it lets go or `until`
runs out, so a front that dies mid-job leaves the job to another once the term is over. On
SQLite there is one front and every claim is granted.
"""

from __future__ import annotations

from chatbox.store.db import Database

_NOW = "extract(epoch FROM clock_timestamp())::float8"


class JobRepo:
    """Claims on named background jobs."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def claim(self, name: str, hold_s: float) -> bool:
        """Take job `name` for `hold_s` seconds; False while another front holds it."""
        if self.db.dialect != "postgresql":
            return True
        from chatbox.store.pg import PgDatabase

        assert isinstance(self.db, PgDatabase)
        async with self.db.pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO job_claims (name, front, until) VALUES ($1, '', 0)"
                " ON CONFLICT (name) DO NOTHING",
                name,
            )
            async with conn.transaction():
                free = await conn.fetchval(
                    f"SELECT name FROM job_claims WHERE name = $1 AND until <= {_NOW}"
                    " FOR UPDATE SKIP LOCKED",
                    name,
                )
                if free is None:
                    return False
                await conn.execute(
                    f"UPDATE job_claims SET front = $2, until = {_NOW} + $3 WHERE name = $1",
                    name,
                    self.db.front,
                    float(hold_s),
                )
        return True

    async def done(self, name: str) -> None:
        """Let go of a claim this front holds (the job may be claimed again at once)."""
        if self.db.dialect != "postgresql":
            return
        from chatbox.store.pg import PgDatabase

        assert isinstance(self.db, PgDatabase)
        await self.db.pool.execute(
            "UPDATE job_claims SET until = 0 WHERE name = $1 AND front = $2", name, self.db.front
        )
