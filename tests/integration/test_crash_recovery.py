"""SIGKILL mid-answer, start again: the user turn and the partial answer are kept."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from chatbox.store import open_database
from tests.conftest import run_sql, store_env, store_for
from tests.sse import parse_sse

pytestmark = pytest.mark.model


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(data_dir: Path, port: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "CHATBOX_DRAFT_FLUSH_S": "0.1",
        "CHATBOX_N_CTX": "4096",
        "CHATBOX_N_PARALLEL": "2",
        "CHATBOX_N_CTX_PER_SEQ": "2048",
        "CHATBOX_ADMIN_PASSWORD": "crash-test-password",
        **store_env(data_dir),
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "chatbox",
            "--data-dir",
            str(data_dir),
            "serve",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        env=env,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, "server exited"
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("server not ready")


def api_key(data_dir: Path) -> dict[str, str]:
    """The scripted setup: seed the admin from the env, print a key on stdout."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "chatbox",
            "--data-dir",
            str(data_dir),
            "keys",
            "create",
            "--user",
            "admin",
        ],
        env={**os.environ, "CHATBOX_ADMIN_PASSWORD": "crash-test-password", **store_env(data_dir)},
        check=True,
        capture_output=True,
        text=True,
    )
    return {"Authorization": f"Bearer {out.stdout.strip()}"}


def test_sigkill_mid_answer_loses_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    auth = api_key(data_dir)
    port = free_port()
    proc = start(data_dir, port)
    url = f"http://127.0.0.1:{port}"
    try:
        conv_id = httpx.post(
            f"{url}/v1/conversations", json={"model": "smollm2"}, headers=auth
        ).json()["id"]
        seen = ""
        body = {"content": "Write a long poem about autumn leaves.", "max_tokens": 400}
        with httpx.stream(
            "POST", f"{url}/v1/conversations/{conv_id}/turns", json=body, timeout=60, headers=auth
        ) as stream:
            for event in parse_sse(stream.iter_lines()):
                if event.event == "token":
                    seen += event.json()["text"]
                if len(seen) > 40:
                    break
            time.sleep(0.4)  # a draft flush happens meanwhile
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=120)  # a killed process in a disk wait dies once it ends
    finally:
        if proc.poll() is None:
            proc.kill()

    proc = start(data_dir, port)
    try:
        turns = httpx.get(f"{url}/v1/conversations/{conv_id}", headers=auth).json()["turns"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert [t["role"] for t in turns] == ["user", "assistant"]
    assert turns[0]["content"] == body["content"]
    partial = turns[1]
    assert partial["status"] == "interrupted"
    assert partial["content"]
    assert partial["content"].startswith(seen[:20]) or seen.startswith(partial["content"])

    assert asyncio.run(_intact(store_for(data_dir)))
    assert run_sql(store_for(data_dir), "SELECT count(*) FROM drafts") == [(0,)]


async def _intact(database: Path | str) -> bool:
    db = await open_database(database)
    try:
        return await db.integrity_ok()
    finally:
        await db.close()
