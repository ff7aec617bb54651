"""Two `chatbox serve` fronts on one PostgreSQL database hold one set of limits: a user's
rate limit, a login lockout and open answers count on both, and the answers of a front
that was killed stop counting once their lease runs out."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from chatbox.chat.policy import default_policy_path
from tests.pg import PgServer
from tests.served import Served

RPM = 2  # the free tier's requests per minute here (one back every 30 s)
LEASE_S = 2  # how long a dead front's answers keep counting


@pytest.fixture(scope="module")
def fronts(
    tmp_path_factory: pytest.TempPathFactory, postgres: PgServer, tiny_gguf: Path
) -> Iterator[tuple[Served, Served]]:
    root = tmp_path_factory.mktemp("fronts")
    shipped = default_policy_path().read_text()
    tiers = re.sub(r"(\[tiers\.free\]\n)rpm = \d+", rf"\g<1>rpm = {RPM}", shipped)
    tiers = re.sub(r"(\[tiers\.free\][^\[]*)max_streams = \d+", r"\g<1>max_streams = 1", tiers)
    # Moderation off: these tests are about limits, and need no classifiers trained first.
    tiers = re.sub(r"(\[moderation\]\n(?:#.*\n)*)enabled = true", r"\g<1>enabled = false", tiers)
    assert tiers.count(f"rpm = {RPM}\n") == 1 and "max_streams = 1\n" in tiers
    assert re.search(r"\[moderation\]\n(#.*\n)*enabled = false", tiers)
    policy = root / "tiers.toml"
    policy.write_text(tiers)
    env = {
        "CHATBOX_DATABASE_URL": postgres.fresh_database(),
        "CHATBOX_LOGIN_MAX_FAILURES": "3",
        "CHATBOX_STREAM_LEASE_S": str(LEASE_S),
    }
    boxes = []
    for name in ("a", "b"):
        (root / name).mkdir()
        boxes.append(Served(root / name, model=tiny_gguf, policy=policy, env=env))
    with boxes[0] as a, boxes[1] as b:
        for box in (a, b):  # each front's first answer loads what answers need
            assert ask(box, box.user(f"warm-{box.port}")).status_code == 200
        yield a, b


def ask(box: Served, key: str, max_tokens: int = 2) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    return httpx.post(
        box.url + "/v1/chat/completions", json=body, headers=box.auth(key), timeout=180
    )


def login(box: Served, name: str, password: str) -> httpx.Response:
    with httpx.Client(base_url=box.url, timeout=60) as client:
        page = client.get("/login")
        token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
        assert token, page.text
        return client.post(
            "/login",
            data={"name": name, "password": password, "csrf_token": token.group(1), "next": "/"},
            follow_redirects=False,
        )


def test_a_users_rate_limit_holds_across_both_fronts(fronts: tuple[Served, Served]) -> None:
    a, b = fronts
    key = a.user("ann")
    assert [ask(a, key).status_code for _ in range(RPM)] == [200] * RPM
    refused = ask(b, key)  # the other front: the same bucket, used up
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["limit"] == "requests"
    assert int(refused.headers["retry-after"]) >= 1
    assert ask(b, b.user("bob")).status_code == 200  # another user is not affected


def test_a_login_lockout_holds_across_both_fronts(fronts: tuple[Served, Served]) -> None:
    a, b = fronts
    a.user("cleo")
    assert [login(a, "cleo", "wrong").status_code for _ in range(3)] == [401] * 3
    locked = login(b, "cleo", "cleo" * 2)  # the right password, from the same address
    assert locked.status_code == 429, locked.text
    assert "Too many failed attempts" in locked.text
    assert login(b, "dora", "wrong").status_code == 401  # other accounts are not locked


def test_a_killed_fronts_answers_stop_counting_when_their_lease_ends(
    fronts: tuple[Served, Served],
) -> None:
    a, b = fronts
    key = a.user("eve")
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 900, "stream": True}
    with httpx.stream(
        "POST", a.url + "/v1/chat/completions", json=body, headers=a.auth(key), timeout=60
    ) as stream:
        assert stream.status_code == 200
        next(stream.iter_lines())  # writing: its stream is open
        a.kill()  # mid-answer: front a never ends it
    try:
        refused = ask(b, key)  # the free tier's one answer at a time is still held
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["limit"] == "streams"
        deadline = time.monotonic() + 60
        while (answered := ask(b, key)).status_code == 429 and time.monotonic() < deadline:
            assert answered.json()["error"]["limit"] == "streams"
            time.sleep(0.5)
        assert answered.status_code == 200, answered.text  # the dead front's lease ran out
    finally:
        a.start()  # the module's other tests see two fronts again
