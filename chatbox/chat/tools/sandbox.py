"""The code interpreter's sandbox: a Python snippet run in a separate process with hard limits.

With bubblewrap (`bwrap`, the Debian package `bubblewrap`) the snippet runs in new user, PID,
network, IPC, UTS and cgroup namespaces: no network at all (only a loopback that is down), a
read-only root holding `/usr` and nothing else of the host (no data directory, no `/etc`, no
home, no `/tmp`), a scratch tmpfs of `scratch_bytes` at `/tmp` as its working directory, an
empty environment, a new session (no terminal to inject keys into), all capabilities dropped,
and death with its caller. Without bubblewrap (`isolation == "process"`) only the limits, an
empty environment and a scratch working directory apply: see SECURITY.md for what that leaves.

Either way the snippet's own process sets, before any of its code runs, hard resource limits
it cannot raise again: CPU seconds (RLIMIT_CPU), address space (RLIMIT_AS), processes
(RLIMIT_NPROC), file size (RLIMIT_FSIZE), open files and no core dumps; the caller bounds the
wall time and the output it reads, and kills the whole sandbox past either. When the caller
runs as root the sandbox runs as `nobody` (the kernel never applies RLIMIT_NPROC to root): a
small interpreter prefix drops to it and execs the sandbox, so the same argv runs on any event
loop (uvloop, which `chatbox serve` runs on, takes no `user`/`group` for a subprocess)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NOBODY = 65534
MAX_CODE_BYTES = 64 * 1024  # the snippet travels as one argument (the kernel allows 128 KiB)
SYSTEM_PYTHON = "/usr/bin/python3"

# Runs first when the caller is root: no groups, then nobody's gid and uid, then the sandbox.
_DROP = (
    "import os, sys; os.setgroups([]); os.setgid({uid}); os.setuid({uid}); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)

# Runs first in the sandboxed interpreter: the limits, then the snippet (argv[1]) as __main__.
_BOOT = """\
import resource as r, sys
for k, v in ((r.RLIMIT_CPU, {cpu}), (r.RLIMIT_AS, {mem}), (r.RLIMIT_NPROC, {nproc}),
             (r.RLIMIT_FSIZE, {fsize}), (r.RLIMIT_NOFILE, 64), (r.RLIMIT_CORE, 0)):
    r.setrlimit(k, (v, v))
code = sys.argv[1]
sys.argv = ["snippet.py"]
del r, k, v
exec(compile(code, "snippet.py", "exec"), {{"__name__": "__main__"}})
"""


@dataclass(frozen=True)
class Limits:
    """What one run may use."""

    cpu_s: int = 5  # CPU seconds of each process
    wall_s: float = 10.0  # the whole run, from start to the last byte of output
    memory_bytes: int = 256 * 1024 * 1024  # address space of each process
    processes: int = 16  # processes and threads at once
    output_bytes: int = 64 * 1024  # of stdout and of stderr each; past it the run is killed
    file_bytes: int = 8 * 1024 * 1024  # the largest file it may write
    scratch_bytes: int = 32 * 1024 * 1024  # the scratch tmpfs (bubblewrap only)


@dataclass(frozen=True)
class RunResult:
    """How a run ended and what it printed (each stream cut at `output_bytes`)."""

    stdout: str
    stderr: str
    exit_code: int | None  # None: killed by the caller (wall time or output)
    signal: str | None  # the signal that ended it (SIGKILL, SIGXCPU, ...)
    timed_out: bool
    truncated: bool
    isolation: str  # "bwrap" or "process"
    seconds: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.truncated


def find_bwrap() -> str | None:
    """The bubblewrap binary on PATH (None: not installed)."""
    return shutil.which("bwrap")


@dataclass
class Sandbox:
    """Runs Python snippets under `limits`; `bwrap=None` runs them as a bare limited process."""

    limits: Limits = field(default_factory=Limits)
    python: str = SYSTEM_PYTHON  # an interpreter under /usr (the only host tree bound)
    bwrap: str | None = field(default_factory=find_bwrap)

    @property
    def isolation(self) -> str:
        return "bwrap" if self.bwrap else "process"

    def _boot(self) -> str:
        lim = self.limits
        return _BOOT.format(
            cpu=lim.cpu_s, mem=lim.memory_bytes, nproc=lim.processes, fsize=lim.file_bytes
        )

    def _argv(self, code: str, as_root: bool = False) -> list[str]:
        drop = [self.python, "-I", "-S", "-B", "-c", _DROP.format(uid=NOBODY)] if as_root else []
        run = [self.python, "-I", "-S", "-B", "-c", self._boot(), code]
        if not self.bwrap:
            return [*drop, *run]
        base = [self.bwrap, "--ro-bind", "/usr", "/usr"]
        for name in ("bin", "lib", "lib64", "sbin"):
            where = Path("/") / name
            if where.is_symlink():
                base += ["--symlink", os.readlink(where), str(where)]
            elif where.is_dir():
                base += ["--ro-bind", str(where), str(where)]
        return [
            *drop,
            *base,
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--remount-ro",  # device nodes stay usable; no writable tmpfs beside the scratch
            "/dev",
            "--size",
            str(self.limits.scratch_bytes),
            "--tmpfs",
            "/tmp",
            "--remount-ro",
            "/",
            "--chdir",
            "/tmp",
            "--unshare-all",  # user, pid, net, ipc, uts, cgroup
            "--hostname",
            "sandbox",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--clearenv",
            "--setenv",
            "HOME",
            "/tmp",
            "--setenv",
            "PATH",
            "/usr/bin:/bin",
            "--",
            *run,
        ]

    async def unusable(self) -> str | None:
        """Why this sandbox cannot run snippets here (bubblewrap without user namespaces,
        no interpreter), or None when it can."""
        try:
            result = await self.run("print('ready')")
        except OSError as exc:
            return str(exc)
        return None if result.ok and result.stdout == "ready\n" else result.stderr.strip()

    async def run(self, code: str) -> RunResult:
        """Run `code` and wait for it (never longer than `wall_s` plus a kill)."""
        if len(code.encode()) > MAX_CODE_BYTES or "\0" in code:
            raise ValueError(f"code must be under {MAX_CODE_BYTES:,} bytes, without NUL")
        started = time.monotonic()
        scratch = tempfile.mkdtemp(prefix="chatbox-sandbox-")
        try:
            return await self._run(code, scratch, started)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    async def _run(self, code: str, scratch: str, started: float) -> RunResult:
        as_root = os.geteuid() == 0
        if as_root:
            os.chown(scratch, NOBODY, NOBODY)
        proc = await asyncio.create_subprocess_exec(
            *self._argv(code, as_root),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin"},
            cwd=scratch,
            start_new_session=True,  # one group to kill, apart from the caller's
            close_fds=True,
        )
        assert proc.stdout is not None and proc.stderr is not None
        out, err, over = bytearray(), bytearray(), asyncio.Event()
        limit = self.limits.output_bytes
        readers = [
            asyncio.create_task(_read(proc.stdout, out, limit, over)),
            asyncio.create_task(_read(proc.stderr, err, limit, over)),
        ]
        ended = asyncio.ensure_future(asyncio.gather(*readers, proc.wait()))
        flood = asyncio.create_task(over.wait())
        timed_out = False
        either: set[asyncio.Future[Any]] = {ended, flood}
        try:
            done, _ = await asyncio.wait(
                either, timeout=self.limits.wall_s, return_when=asyncio.FIRST_COMPLETED
            )
            if ended not in done:
                timed_out = not flood.done()
                _kill(proc)
                # A process that left the group may hold the pipes open: stop reading them.
                try:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(5.0):
                            await asyncio.shield(proc.wait())
                finally:
                    for reader in readers:
                        reader.cancel()
                    ended.cancel()
                    await asyncio.gather(ended, return_exceptions=True)
        except BaseException:
            _kill(proc)
            raise
        finally:
            flood.cancel()
        status = proc.returncode
        killed = timed_out or over.is_set()
        sig = signal.Signals(-status).name if status is not None and status < 0 else None
        return RunResult(
            stdout=out[:limit].decode("utf-8", "replace"),
            stderr=err[:limit].decode("utf-8", "replace"),
            exit_code=None if killed else status,
            signal=sig,
            timed_out=timed_out,
            truncated=over.is_set(),
            isolation=self.isolation,
            seconds=time.monotonic() - started,
        )


async def _read(
    stream: asyncio.StreamReader, into: bytearray, limit: int, over: asyncio.Event
) -> None:
    """Read a stream to its end into `into`; past `limit` bytes, set `over` and discard the
    rest (still read: on Python 3.11 a process's wait ends only once its pipes close)."""
    while chunk := await stream.read(65536):
        if len(into) <= limit:
            into += chunk
            if len(into) > limit:
                over.set()


def _kill(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the sandbox's process group (bubblewrap's namespace dies with its first)."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
