"""`chatbox serve` as a user starts it: the console script in a subprocess, with the shipped
policy and the default logging unless a test says otherwise.

    with Served(tmp_path, model=tiny_gguf) as box:
        key = box.user("ann")               # a member with an API key (the CLI's `users add`)
        httpx.post(box.url + "/v1/...", headers=box.auth(key))
        box.kill(); box.start()             # SIGKILL, then the same data directory again
        assert "secret" not in box.log()    # everything the process wrote, stdout and stderr

`model` is a GGUF registered as the default with the CLI (`models add --link --default`), and
every tier of the policy then routes to it (no test waits for the real models behind the tiers);
None serves the shipped models. `policy` is a path to a policy file; "no-output-moderation"
serves the shipped policy with output moderation off (random tiny-model text must not be cut
in tests of something else); None serves the shipped policy as it is.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

import httpx

from tests.conftest import rows_holding, store_env
from tests.sse import Event, parse_sse

ADMIN_PASSWORD = "served-admin-password"
CHATBOX = str(Path(sys.executable).parent / "chatbox")  # the console script pip installed
_CACHE: list[Path] = []


def shared_cache_dir() -> Path:
    """One cache directory for every server a test run starts (its worker processes' too, and
    both store passes of scripts/test.sh, which names it in CHATBOX_TEST_CACHE_DIR): the
    embedding model's export and the moderation classifiers are made once per run, not once
    per server (servers starting together write it atomically)."""
    if not _CACHE:
        run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
        if given := os.environ.get("CHATBOX_TEST_CACHE_DIR"):
            _CACHE.append(Path(given))
            _CACHE[0].mkdir(parents=True, exist_ok=True)
        elif run is None:
            _CACHE.append(Path(tempfile.mkdtemp(prefix="chatbox-served-cache-")))
        else:
            _CACHE.append(Path(tempfile.gettempdir()) / f"chatbox-served-cache-{run}")
            _CACHE[0].mkdir(exist_ok=True)
    return _CACHE[0]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Served:
    """One `chatbox serve` process over one data directory (restartable)."""

    def __init__(
        self,
        where: Path,
        *,
        model: Path | None = None,
        policy: Path | str | None = "no-output-moderation",
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        small: bool = True,
    ) -> None:
        self.where = where
        self.data_dir = where / "data"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = args
        self.log_path = where / "served.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CHATBOX_")}
        self.env.update(
            CHATBOX_ADMIN_PASSWORD=ADMIN_PASSWORD,
            CHATBOX_CACHE_DIR=str(shared_cache_dir()),
        )
        if small:  # the shape the in-process tests use (one thread: see test_settings)
            self.env.update(
                CHATBOX_N_PARALLEL="4",
                CHATBOX_N_CTX="4096",
                CHATBOX_N_CTX_PER_SEQ="1024",
                CHATBOX_N_THREADS="1",
            )
        if policy == "no-output-moderation":
            policy = self._policy_without_output_checks()
        if model is not None:
            policy = self._policy_on_tiny(Path(policy) if policy else None)
        if policy is not None:
            self.env["CHATBOX_POLICY_PATH"] = str(policy)
        self.env.update(store_env(self.data_dir))  # the suite's store; env may say otherwise
        self.env.update(env or {})
        if model is not None:
            self.setup_cli("models", "add", str(model), "--name", "tiny", "--link", "--default")
        self.admin_key = self.setup_cli("keys", "create", "--user", "admin").splitlines()[-1]

    def _policy_without_output_checks(self) -> Path:
        from tests.conftest import _answers_unchecked

        return _answers_unchecked(None, self.where)

    def _policy_on_tiny(self, policy: Path | None) -> Path:
        from chatbox.chat.policy import default_policy_path

        text = (policy or default_policy_path()).read_text()
        for name in ("smollm2", "gemma3-270m"):
            text = text.replace(f'"{name}"', '"tiny"')
        path = self.where / "policy-on-tiny.toml"
        path.write_text(text)
        return path

    @property
    def database(self) -> Path | str:
        """The box's store: its SQLite file, or its PostgreSQL database's URL."""
        return self.env.get("CHATBOX_DATABASE_URL") or self.data_dir / "chatbox.db"

    # -- the CLI, on the same data directory -------------------------------------------------
    def cli(self, *args: str, check: bool = True, input: str | None = None) -> str:
        """Run `chatbox --data-dir DIR ARGS…` and return its stdout."""
        done = subprocess.run(
            [CHATBOX, "--data-dir", str(self.data_dir), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=180,
            input=input,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"chatbox {' '.join(args)}: {done.stderr or done.stdout}")
        return done.stdout

    def setup_cli(self, *args: str) -> str:
        """The same command as cli(), run in this process on the box's settings: for setting
        a box up (its people, its model), where a process a call (~1 s of CPU, mostly imports)
        would be most of a served test's cost. Tests of the command line use cli()."""
        from click.testing import CliRunner, Result

        from chatbox.cli import main
        from chatbox.settings import settings_from_env

        def invoke() -> Result:
            argv = ["--data-dir", str(self.data_dir), *args]
            return CliRunner().invoke(main, argv, obj=settings_from_env(self.env))

        with ThreadPoolExecutor(1) as pool:  # its own thread: the caller may be in a loop
            done = pool.submit(invoke).result()
        if done.exit_code != 0:
            raise AssertionError(f"chatbox {' '.join(args)}: {done.output}") from done.exception
        return done.stdout.strip()

    def cli_refused(self, *args: str) -> str:
        """Run `chatbox --data-dir DIR ARGS…`, expecting a refusal (exit 1, a message and no
        traceback); its stderr."""
        done = subprocess.run(
            [CHATBOX, "--data-dir", str(self.data_dir), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 1, done.stdout + done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        return done.stderr

    def user(self, name: str, role: str = "member", tier: str = "free") -> str:
        """Add a person with a password (their name twice) and return a new API key."""
        args = ("--role", role, "--tier", tier, "--password", name * 2, "--key")
        return self.setup_cli("users", "add", name, *args).splitlines()[-1]

    @staticmethod
    def auth(key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    @property
    def admin(self) -> dict[str, str]:
        return self.auth(self.admin_key)

    # -- the process ----------------------------------------------------------------------
    def start(self, timeout_s: float = 420.0) -> Served:
        """Start `chatbox serve` and wait until /readyz says ready (the first start of a run
        trains moderation's classifiers and exports the encoders before it is ready)."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        first = self.proc is None
        for _ in range(4):
            logged = self.log_path.stat().st_size if self.log_path.exists() else 0
            try:
                return self._start(timeout_s)
            except AssertionError:
                # A port found free can be taken before the server binds it (another server
                # or a client's ephemeral port): a first start moves to another.
                refused = b"address already in use" in self.log_path.read_bytes()[logged:]
                if not (first and refused):
                    raise
                self.port = free_port()
                self.url = f"http://127.0.0.1:{self.port}"
        raise AssertionError(f"chatbox serve found no free port:\n{self.log()[-4000:]}")

    def _start(self, timeout_s: float) -> Served:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                CHATBOX,
                "--data-dir",
                str(self.data_dir),
                "serve",
                "--port",
                str(self.port),
                *self.args,
            ],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"chatbox serve exited:\n{self.log()[-4000:]}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.kill()
        raise AssertionError(f"chatbox serve not ready in {timeout_s} s:\n{self.log()[-4000:]}")

    def stop(self, timeout_s: float = 60.0) -> int:
        """A clean stop (SIGTERM, as a service manager sends); returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise AssertionError("chatbox serve did not stop on SIGTERM") from None

    def kill(self) -> None:
        """SIGKILL: the crash a power cut or the OOM killer causes."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def rss_bytes(self) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def log(self) -> str:
        """Everything the process wrote so far (stdout and stderr, every start)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def holding(self, secret: str) -> list[str]:
        """Where the box keeps `secret`: files under its data directory, and on PostgreSQL
        the tables with a live row holding it (any case)."""
        return files_holding(self.data_dir, secret) + rows_holding(self.database, secret)

    def conversation(self, key: str) -> str:
        """A new conversation of the key's user; its id."""
        resp = httpx.post(
            self.url + "/v1/conversations", headers=self.auth(key), json={}, timeout=30
        )
        assert resp.status_code == 201, resp.text
        return str(resp.json()["id"])

    @contextmanager
    def turn(
        self, key: str, conv: str, text: str, max_tokens: int
    ) -> Iterator[tuple[httpx.Response, Iterator[Event]]]:
        """A turn's answer as it streams: the response (its headers) and its events."""
        with httpx.stream(
            "POST",
            f"{self.url}/v1/conversations/{conv}/turns",
            headers=self.auth(key),
            json={"content": text, "max_tokens": max_tokens},
            timeout=180,
        ) as resp:
            assert resp.status_code == 200, resp.read().decode()
            yield resp, parse_sse(resp.iter_lines())

    def files(self) -> list[Path]:
        """Every file under the data directory."""
        return [p for p in self.data_dir.rglob("*") if p.is_file()]

    def __enter__(self) -> Served:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop() if kind is None else self.kill()


def files_holding(root: Path, secret: str) -> list[str]:
    """Files under `root` whose bytes contain `secret` (as `grep -rac` would find it)."""
    needle = secret.encode()
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]
