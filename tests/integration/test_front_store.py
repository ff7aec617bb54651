"""A front on PostgreSQL and its data directory.

When the database goes away every call that needs it answers 503 with `Retry-After` (never a
500), the log gets one line per such call (never a traceback), `/readyz` says why it is not
ready, and the front serves again once the database is back. The front notes in its data
directory that its store is in PostgreSQL (without the password): the CLI there without the
URL is refused instead of making a SQLite store of its own, and with `--database-url` and
`--policy` it adds a user on one of the policy's tiers where the front sees them."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from chatbox.chat.policy import default_policy_path
from tests.pg import PgServer, binaries
from tests.served import CHATBOX, Served

PASSWORD = "pg-secret-7731"  # trust auth takes any password; the note must not keep it

pytestmark = pytest.mark.skipif(binaries() is None, reason="PostgreSQL is not installed")


@pytest.fixture(scope="module")
def database() -> Iterator[PgServer]:
    """A PostgreSQL server of this module's own: stopping it disturbs no other test."""
    server = PgServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def box(
    tmp_path_factory: pytest.TempPathFactory, database: PgServer, tiny_gguf: Path
) -> Iterator[Served]:
    where = tmp_path_factory.mktemp("outage")
    # Moderation off: this is about the store, and needs no classifiers trained first.
    text = re.sub(
        r"(\[moderation\]\n(?:#.*\n)*)enabled = true",
        r"\g<1>enabled = false",
        default_policy_path().read_text(),
    )
    # A tier only this policy has: the CLI knows it only from the policy the front uses.
    text = text.replace("[tiers.paid]", '[tiers.team]\nrpm = 60\nmodel = "smollm2"\n\n[tiers.paid]')
    policy = where / "policy.toml"
    policy.write_text(text)
    url = database.fresh_database().replace("chatbox@", f"chatbox:{PASSWORD}@")
    env = {"CHATBOX_DATABASE_URL": url}
    with Served(where, model=tiny_gguf, policy=policy, env=env) as served:
        yield served


def test_a_database_outage_is_a_503_with_retry_after_and_one_log_line(
    box: Served, database: PgServer
) -> None:
    key = box.user("ann")
    conv = box.conversation(key)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    logged = len(box.log())
    database.halt()
    try:
        calls = [
            httpx.get(f"{box.url}/v1/conversations", headers=box.auth(key), timeout=60),
            httpx.get(f"{box.url}/v1/conversations/{conv}", headers=box.auth(key), timeout=60),
            httpx.post(
                f"{box.url}/v1/conversations/{conv}/turns",
                headers=box.auth(key),
                json={"content": "hello", "max_tokens": 2},
                timeout=60,
            ),
            httpx.post(
                f"{box.url}/v1/chat/completions", headers=box.auth(key), json=body, timeout=60
            ),
        ]
        for resp in calls:
            assert resp.status_code == 503, (resp.request.url, resp.text)
            assert int(resp.headers["retry-after"]) >= 1
            error = resp.json()["error"]
            assert "database cannot be reached" in error["message"], error
        assert calls[-1].json()["error"]["type"] == "server_error"  # OpenAI's shape
        assert calls[-1].json()["error"]["code"] == "store_unavailable"
        ready = httpx.get(f"{box.url}/readyz", timeout=60)
        assert ready.status_code == 503
        assert ready.json()["database_writable"] is False
        assert "database" in ready.json()["database_error"], ready.json()
    finally:
        database.resume()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        back = httpx.get(f"{box.url}/v1/conversations", headers=box.auth(key), timeout=60)
        if back.status_code != 503:
            break
        time.sleep(0.5)
    assert back.status_code == 200, back.text
    assert [c["id"] for c in back.json()["data"]] == [conv]
    assert httpx.get(f"{box.url}/readyz", timeout=60).status_code == 200
    log = box.log()[logged:]
    assert "Traceback" not in log, log[-4000:]
    lines = [line for line in log.splitlines() if "503, The database cannot be reached" in line]
    assert len(lines) >= len(calls), log[-4000:]


def bare_cli(box: Served, *args: str) -> subprocess.CompletedProcess[str]:
    """`chatbox --data-dir DIR ARGS…` with no CHATBOX_* setting but the box's cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHATBOX_")}
    env["CHATBOX_CACHE_DIR"] = box.env["CHATBOX_CACHE_DIR"]
    return subprocess.run(
        [CHATBOX, "--data-dir", str(box.data_dir), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_the_cli_on_a_postgresql_fronts_data_directory_finds_its_store(box: Served) -> None:
    url = box.env["CHATBOX_DATABASE_URL"]
    notes = [p for p in box.files() if "postgresql" in p.name]
    assert len(notes) == 1, box.files()
    note = notes[0].read_text()
    assert url.replace(f":{PASSWORD}", "") in note and PASSWORD not in note

    for args in (("users", "add", "zed", "--password", "zedzedzed"), ("serve",)):
        refused = bare_cli(box, *args)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "PostgreSQL" in refused.stderr and "--database-url" in refused.stderr
        assert "Traceback" not in refused.stderr
    assert not list(box.data_dir.glob("*.db*"))  # no SQLite store made beside the real one

    policy = box.env["CHATBOX_POLICY_PATH"]
    added = bare_cli(box, "--database-url", url, "--policy", policy, "users", "add", "zed",
                     "--tier", "team", "--password", "zedzedzed")  # fmt: skip
    assert added.returncode == 0, added.stderr
    made = bare_cli(box, "--database-url", url, "keys", "create", "--user", "zed")
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip().splitlines()[-1]
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    answer = httpx.post(
        f"{box.url}/v1/chat/completions", headers=box.auth(key), json=body, timeout=180
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-ratelimit-limit-requests"] == "60"  # the team tier's
