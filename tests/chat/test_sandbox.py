"""The code interpreter's sandbox: network, writes outside the scratch directory, reading the
data directory, a fork bomb, memory and CPU exhaustion, sleeping forever and flooding output
all fail inside it, and the caller stays healthy (it can still start processes, nothing of
the run is left behind, the next run works).

The resource limits are tested with bubblewrap and without it (a bare limited process); the
namespace checks need bubblewrap and are skipped, saying so, where it is missing or cannot
create namespaces (no unprivileged user namespaces)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from chatbox.chat.tools.sandbox import SYSTEM_PYTHON, Limits, RunResult, Sandbox, find_bwrap


def _bwrap_works() -> str | None:
    """Why bubblewrap cannot isolate here, or None when it can."""
    if find_bwrap() is None:
        return "bubblewrap is not installed (Debian package `bubblewrap`)"
    why = asyncio.run(Sandbox().unusable())
    return None if why is None else f"bubblewrap cannot create namespaces here: {why}"


NO_BWRAP = _bwrap_works()
needs_bwrap = pytest.mark.skipif(NO_BWRAP is not None, reason=str(NO_BWRAP))
pytestmark = pytest.mark.skipif(
    not Path(SYSTEM_PYTHON).exists(), reason=f"{SYSTEM_PYTHON} is the sandbox's interpreter"
)
CPU_SIGNALS = (signal.SIGKILL, signal.SIGXCPU)
FAST = Limits(cpu_s=2, wall_s=4.0, output_bytes=4096)


def run(sandbox: Sandbox, code: str) -> RunResult:
    return asyncio.run(sandbox.run(code))


def _alive(marker: str) -> list[int]:
    """Processes whose command line holds `marker` (the snippet travels in argv)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def assert_healthy(sandbox: Sandbox, marker: str) -> None:
    """Nothing of the run is left, the caller still starts processes, the next run works."""
    deadline = time.monotonic() + 10
    while _alive(marker):
        assert time.monotonic() < deadline, f"left running: {_alive(marker)}"
        time.sleep(0.1)
    assert subprocess.run(["true"], check=False).returncode == 0
    again = run(sandbox, "print(6 * 7)")
    assert again.ok and again.stdout == "42\n", again


@pytest.fixture(
    params=[pytest.param("bwrap", marks=needs_bwrap), "process"],
)
def sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    box = Sandbox(FAST) if request.param == "bwrap" else Sandbox(FAST, bwrap=None)
    assert box.isolation == request.param
    yield box


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory anyone may enter and write (pytest's own are the caller's alone): only
    the sandbox's mounts, not permissions, keep a snippet out of it."""
    path = Path(tempfile.mkdtemp(prefix="chatbox-sandbox-test-"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def isolated() -> Sandbox:
    if NO_BWRAP is not None:
        pytest.skip(NO_BWRAP)
    return Sandbox(FAST)


def test_a_snippet_runs_and_uses_its_scratch_directory(sandbox: Sandbox) -> None:
    code = "import os\nopen('notes.txt', 'w').write('kept')\nprint(open('notes.txt').read())"
    code += "\nprint(sorted(os.environ))"
    result = run(sandbox, code)
    assert result.ok, result
    kept, env = result.stdout.splitlines()
    assert kept == "kept"
    assert set(eval(env)) <= {"PATH", "HOME", "PWD", "LC_CTYPE"}  # nothing of the caller's


def test_a_fork_bomb_hits_the_process_limit(sandbox: Sandbox) -> None:
    marker = uuid.uuid4().hex
    code = f"""# {marker}
import os
failed = 0
while True:
    try:
        os.fork()
    except OSError:
        failed += 1
        if failed == 200 and os.getpid() and os.getppid():
            print("fork refused", flush=True)
"""
    result = run(sandbox, code)
    assert not result.ok
    assert "fork refused" in result.stdout
    assert_healthy(sandbox, marker)


def test_memory_exhaustion_fails_inside(sandbox: Sandbox) -> None:
    result = run(sandbox, "hog = bytearray(2 << 30)\nprint('allocated')")
    assert result.exit_code == 1 and "MemoryError" in result.stderr, result
    assert "allocated" not in result.stdout
    assert_healthy(sandbox, "bytearray(2 << 30)")


def test_cpu_exhaustion_is_ended_by_the_cpu_limit(sandbox: Sandbox) -> None:
    marker = uuid.uuid4().hex
    sandbox.limits = Limits(cpu_s=1, wall_s=30.0)
    result = run(sandbox, f"# {marker}\nwhile True:\n    pass")
    # The CPU limit's signal ended it (bubblewrap reports a child's signal as 128 + n), not
    # the wall clock.
    assert not result.timed_out, result
    assert result.exit_code in {-n for n in CPU_SIGNALS} | {128 + n for n in CPU_SIGNALS}
    assert_healthy(sandbox, marker)


def test_a_run_past_its_wall_time_is_killed(sandbox: Sandbox) -> None:
    marker = uuid.uuid4().hex
    sandbox.limits = Limits(wall_s=1.0)
    result = run(sandbox, f"# {marker}\nimport time\nprint('start', flush=True)\ntime.sleep(60)")
    assert result.timed_out and result.exit_code is None and result.stdout == "start\n"
    assert_healthy(sandbox, marker)


def test_an_output_flood_is_cut_and_killed(sandbox: Sandbox) -> None:
    marker = uuid.uuid4().hex
    result = run(sandbox, f"# {marker}\nwhile True:\n    print('x' * 1000)")
    assert result.truncated and not result.ok
    assert len(result.stdout) == FAST.output_bytes
    assert_healthy(sandbox, marker)


def test_there_is_no_network(isolated: Sandbox) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        code = f"""
import socket
for host, port in (("127.0.0.1", {port}), ("1.1.1.1", 53), ("::1", {port})):
    try:
        socket.create_connection((host, port), timeout=2).close()
        print("connected", host)
    except OSError as exc:
        print("refused", host, type(exc).__name__)
"""
        result = run(isolated, code)
        assert result.ok, result
        assert "connected" not in result.stdout and result.stdout.count("refused") == 3
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing reached the caller's port


def test_nothing_outside_scratch_can_be_written(isolated: Sandbox, open_dir: Path) -> None:
    shared = open_dir
    target = shared / "host.txt"
    target.write_text("untouched")
    target.chmod(0o666)
    code = f"""
for path in ({str(target)!r}, {str(shared / "new.txt")!r}, "/usr/evil", "/evil", "/proc/evil"):
    try:
        open(path, "a").write("written")
        print("wrote", path)
    except OSError as exc:
        print("refused", path, type(exc).__name__)
"""
    result = run(isolated, code)
    assert result.ok, result
    assert "wrote" not in result.stdout and result.stdout.count("refused") == 5
    assert target.read_text() == "untouched" and not (shared / "new.txt").exists()


def test_the_data_directory_cannot_be_read(isolated: Sandbox, open_dir: Path) -> None:
    secret = "kestrel" + uuid.uuid4().hex
    data = open_dir / "data"
    data.mkdir()
    (data / "chatbox.db").write_text(secret)
    data.chmod(0o755)
    (data / "chatbox.db").chmod(0o644)
    code = f"""
import os
for path in ({str(data / "chatbox.db")!r}, "/etc/passwd", "/proc/1/environ"):
    try:
        print("read", path, open(path).read()[:200])
    except OSError as exc:
        print("refused", path, type(exc).__name__)
print("listed", os.listdir("/"))
"""
    result = run(isolated, code)
    assert result.ok, result
    assert secret not in result.stdout
    assert f"refused {data / 'chatbox.db'}" in result.stdout
    assert "refused /etc/passwd" in result.stdout
    listed = eval(result.stdout.split("listed", 1)[1])
    assert set(listed) <= {"usr", "bin", "lib", "lib64", "sbin", "proc", "dev", "tmp"}


def test_an_oversized_snippet_is_refused() -> None:
    with pytest.raises(ValueError, match="bytes"):
        run(Sandbox(FAST, bwrap=None), "#" * (65 * 1024))


def test_a_snippet_runs_on_the_servers_event_loop(sandbox: Sandbox) -> None:
    """`chatbox serve` runs on uvloop, whose subprocesses take no user or group: the sandbox
    runs there as on asyncio's own loop, as nobody when the caller is root."""
    uvloop = pytest.importorskip("uvloop")
    code = "import os\nprint(os.getuid(), os.getgid(), os.getgroups())"
    result = uvloop.run(sandbox.run(code))
    assert result.ok, result
    uid, gid, groups = result.stdout.split(" ", 2)
    if os.geteuid() == 0:
        # inside bubblewrap's user namespace nobody's ids map to the overflow id, 65534 too
        assert (int(uid), int(gid), groups.strip()) == (65534, 65534, "[]")
    else:
        assert int(uid) == os.getuid()


def test_dev_cannot_be_filled(isolated: Sandbox) -> None:
    """/dev holds the device nodes and nothing writable: a snippet cannot write a file there
    past the scratch directory's cap (it is not a second tmpfs)."""
    code = """
import os
for path in ("/dev/big", "/dev/shm/big", "/dev/null"):
    try:
        with open(path, "wb") as f:
            f.write(b"x" * 4096)
        print("wrote", path)
    except OSError as exc:
        print("refused", path, type(exc).__name__)
"""
    result = run(isolated, code)
    assert result.ok, result
    assert "refused /dev/big" in result.stdout and "refused /dev/shm/big" in result.stdout
    assert "wrote /dev/null" in result.stdout  # the device nodes themselves still work
