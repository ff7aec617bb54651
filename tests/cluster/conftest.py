"""Router-mode fixtures: `chatbox replica` subprocesses on loopback and a front before them."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from chatbox.catalog.registry import ModelRegistry
from tests.conftest import LiveServer, test_settings
from tests.tinymodel import make_tiny_gguf

TOKEN = "replica-secret-for-tests"
ROOT = Path(__file__).resolve().parent.parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Replica:
    """One `chatbox replica` process serving the tiny model."""

    def __init__(self, data_dir: Path, token: str | None = TOKEN) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "chatbox", "--data-dir", str(data_dir), "replica"]
        # A replica's default engine settings (slots, cached conversations) but room for a
        # 4,000-token answer; one thread each, as three share this machine's cores.
        args += ["--port", str(self.port), "--model", "tiny", "--threads", "1"]
        args += ["--n-ctx-per-seq", "4608"]
        if token:
            args += ["--token", token]
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHATBOX_")}
        self.proc = subprocess.Popen(args, cwd=ROOT, env=env)
        self.headers = headers = {"Authorization": f"Bearer {token}"} if token else {}
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(self.url + "/v1/replica/health", headers=headers).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the replica did not start")
            time.sleep(0.1)

    def stats(self) -> dict[str, Any]:
        """The replica's own view of its tiny engine (its stats endpoint), and open streams."""
        resp = httpx.get(self.url + "/v1/replica/stats", headers=self.headers, timeout=5)
        assert resp.status_code == 200, resp.text
        payload = resp.json()
        return {**payload["models"]["tiny"], "streams": payload["streams"]}

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="module")
def replica_dir(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Path:
    data = tmp_path_factory.mktemp("replica") / "data"
    ModelRegistry(data / "models", data / "no-manifest.toml").add(
        tiny_gguf, name="tiny", make_default=True, copy=False
    )
    return data


@contextlib.contextmanager
def started_replicas(data_dir: Path, n: int) -> Iterator[list[Replica]]:
    """n replica processes on one data directory, stopped on leaving."""
    started: list[Replica] = []
    try:
        for _ in range(n):
            started.append(Replica(data_dir))
        yield started
    finally:
        for r in started:
            r.stop()


@pytest.fixture
def replicas(replica_dir: Path) -> Iterator[list[Replica]]:
    with started_replicas(replica_dir, 3) as started:
        yield started


@pytest.fixture(scope="module")
def replica_pool(replica_dir: Path) -> Iterator[list[Replica]]:
    """Three replicas kept for a module's tests (see shared_replicas)."""
    with started_replicas(replica_dir, 3) as pool:
        yield pool


@pytest.fixture
def shared_replicas(replica_pool: list[Replica], replica_dir: Path) -> Iterator[list[Replica]]:
    """`replicas` for tests that leave a replica as they found it or kill it: each test gets
    the module's three, a killed one replaced after it (a replica's start is most of such a
    test's CPU). Each test's front is its own, so drains and fleet counts start afresh."""
    yield list(replica_pool)
    for i, r in enumerate(replica_pool):
        if r.proc.poll() is not None:
            replica_pool[i] = Replica(replica_dir)


@pytest.fixture
def replica(replica_dir: Path) -> Iterator[Replica]:
    one = Replica(replica_dir)
    try:
        yield one
    finally:
        one.stop()


@pytest.fixture(scope="module")
def slow_replica_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wider "tiny" model: a few hundred tokens a second on one core instead of thousands,
    so an answer is still being written at the replica when a test acts on it."""
    base = tmp_path_factory.mktemp("slow-replica")
    gguf = make_tiny_gguf(base / "slow.gguf", n_layer=4, n_embd=256, n_head=8, n_ff=1024)
    data = base / "data"
    ModelRegistry(data / "models", data / "no-manifest.toml").add(
        gguf, name="tiny", make_default=True, copy=False
    )
    return data


@pytest.fixture
def slow_replica(slow_replica_dir: Path) -> Iterator[Replica]:
    one = Replica(slow_replica_dir)
    try:
        yield one
    finally:
        one.stop()


def front(
    data_dir: Path, urls: list[str], local: Path | None = None, **overrides: object
) -> LiveServer:
    """A front routing the tiny model to these replicas; with `local` (the tiny GGUF) it
    keeps a local engine for the model too, else it runs none."""
    options: dict[str, object] = {
        "replicas": tuple(urls),
        "replica_token": TOKEN,
        "local_engine": local is not None,
        "replica_timeout_s": 2.0,
        "replica_health_s": 0.3,
    }
    settings = test_settings(data_dir, **{**options, **overrides})
    registry = ModelRegistry(data_dir / "models", data_dir / "no-manifest.toml")
    if local is not None:
        registry.add(local, name="tiny", make_default=True, copy=False)
    return LiveServer(settings, registry)
