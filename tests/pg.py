"""A throwaway PostgreSQL server for the test session: `initdb` and `pg_ctl` (Debian's
packages) in a temporary directory, run as an unprivileged user (initdb refuses root).

One server per session; each test gets a fresh database, copied from a migrated template
(`CREATE DATABASE … TEMPLATE`, tens of milliseconds) so no test sees another's rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import asyncpg

from chatbox.store import Store

TEMPLATE = "chatbox_template"
SUPERUSER = "chatbox"


def binaries() -> tuple[str, str] | None:
    """The initdb and pg_ctl on PATH (or in Debian's versioned directory), if any."""
    found = (shutil.which("initdb"), shutil.which("pg_ctl"))
    if all(found):
        return found[0] or "", found[1] or ""
    for base in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (base / "initdb").exists() and (base / "pg_ctl").exists():
            return str(base / "initdb"), str(base / "pg_ctl")
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_user() -> tuple[list[str], int | None]:
    """The command prefix that runs the server as someone other than root (and its uid)."""
    if os.geteuid() != 0:
        return [], None
    user = pwd.getpwnam("nobody")
    return ["runuser", "-u", "nobody", "--"], user.pw_uid


class PgServer:
    """A running server on 127.0.0.1 (trust auth, reachable only from this machine)."""

    def __init__(self) -> None:
        tools = binaries()
        if tools is None:
            raise FileNotFoundError("initdb and pg_ctl are not installed")
        self.initdb, self.pg_ctl = tools
        self.prefix, uid = _as_user()
        self.root = Path(tempfile.mkdtemp(prefix="chatbox-pg-"))
        self.root.chmod(0o755)
        self.data = self.root / "data"
        if uid is not None:
            os.chown(self.root, uid, -1)
        self.port = _free_port()
        self._names = itertools.count(1)

    def url(self, database: str) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def _run(self, *cmd: str) -> None:
        subprocess.run(
            [*self.prefix, *cmd], check=True, capture_output=True, text=True, cwd=self.root
        )

    def start(self) -> PgServer:
        self._run(
            self.initdb, "-D", str(self.data), "-U", SUPERUSER, "-A", "trust",
            "-E", "UTF8", "--no-sync", "--locale=C.UTF-8",
        )  # fmt: skip
        self.resume()
        asyncio.run(self._make_template())
        return self

    def resume(self) -> None:
        """Start the server on its data directory (after `halt`, or the first time)."""
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root}"
            " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            " -c max_connections=300 -c shared_buffers=64MB"
        )
        self._run(
            self.pg_ctl, "-D", str(self.data), "-l", str(self.root / "log"), "-o", options,
            "-w", "start",
        )  # fmt: skip

    def halt(self) -> None:
        """Stop the server as an outage does, keeping its data (`resume` starts it again):
        `fast` ends every session, so clients see their connections terminated."""
        self._run(self.pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "stop")

    async def _make_template(self) -> None:
        conn = await asyncpg.connect(self.url("postgres"))
        try:
            await conn.execute(f"CREATE DATABASE {TEMPLATE}")
        finally:
            await conn.close()
        store = await Store.open(self.url(TEMPLATE))  # every migration, once
        await store.close()

    def fresh_database(self) -> str:
        """The URL of a new, migrated, empty database."""
        name = f"t{os.getpid()}_{next(self._names)}"

        async def create() -> None:
            conn = await asyncpg.connect(self.url("postgres"))
            try:
                await conn.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE} STRATEGY FILE_COPY")
            finally:
                await conn.close()

        # In a thread of its own: the caller may be inside an event loop (an async test).
        with ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, create()).result()
        return self.url(name)

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run(self.pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
