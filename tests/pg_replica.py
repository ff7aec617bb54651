"""A throwaway streaming replica of a `tests.pg.PgServer`: `pg_basebackup -R` of the primary,
started beside it as the same unprivileged user, in hot standby (it serves reads).

The primary's default `wal_level` is already `replica`; a `replicator` role with REPLICATION
connects under pg_hba's replication line for 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import asyncpg

from tests.pg import SUPERUSER, PgServer, _free_port, binaries

REPLICATION_USER = "replicator"


def basebackup() -> str | None:
    """pg_basebackup beside initdb (Debian's versioned directory), or on PATH."""
    tools = binaries()
    if tools is not None:
        beside = Path(tools[0]).resolve().parent / "pg_basebackup"
        if beside.exists():
            return str(beside)
    return shutil.which("pg_basebackup")


def run_sql(url: str, sql: str) -> Any:
    """One statement's value, from a fresh connection (callable inside an event loop)."""

    async def go() -> Any:
        conn = await asyncpg.connect(url)
        try:
            return await conn.fetchval(sql)
        finally:
            await conn.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, go()).result()


class PgReplica:
    """A hot standby of `primary`, streaming from it (its own port, same root directory)."""

    def __init__(self, primary: PgServer) -> None:
        tool = basebackup()
        if tool is None:
            raise FileNotFoundError("pg_basebackup is not installed")
        self.tool = tool
        self.primary = primary
        self.data = primary.root / "replica"
        self.port = _free_port()

    def url(self, database: str) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def _run(self, *cmd: str) -> None:
        done = subprocess.run(
            [*self.primary.prefix, *cmd],
            capture_output=True,
            text=True,
            cwd=self.primary.root,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{cmd[0]} failed: {done.stderr or done.stdout}")

    def start(self) -> PgReplica:
        """Copy the primary (`pg_basebackup -R` writes standby.signal and primary_conninfo)."""
        run_sql(
            self.primary.url("postgres"),
            f"CREATE ROLE {REPLICATION_USER} WITH REPLICATION LOGIN",
        )
        self._run(
            self.tool, "-D", str(self.data), "-h", "127.0.0.1", "-p", str(self.primary.port),
            "-U", REPLICATION_USER, "-R", "-X", "stream", "--no-sync", "--checkpoint=fast",
        )  # fmt: skip
        return self.resume_server()

    def resume_server(self) -> PgReplica:
        """Start the standby (again); it catches up from the primary's WAL."""
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.primary.root}"
            " -c fsync=off -c hot_standby=on -c max_connections=300 -c shared_buffers=32MB"
        )  # a hot standby needs at least the primary's max_connections
        self._run(
            self.primary.pg_ctl, "-D", str(self.data), "-l", str(self.primary.root / "replica.log"),
            "-o", options, "-w", "start",
        )  # fmt: skip
        return self

    def stop(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._run(self.primary.pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "stop")

    def has(self, database: str, sql: str) -> Any:
        """`sql`'s value on the replica's copy of `database`."""
        return run_sql(self.url(database), sql)

    def wait_for(self, database: str, sql: str, timeout_s: float = 30.0) -> None:
        """Wait until `sql` is true on the replica's copy of `database` (it has replayed)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self.has(database, sql):
                    return
            except (OSError, asyncpg.PostgresError):
                pass  # not yet replayed (the database itself may not exist there yet)
            if time.monotonic() > deadline:
                raise AssertionError(f"the replica did not replay {sql!r} in {timeout_s} s")
            time.sleep(0.1)
