"""Two `chatbox serve` fronts on one PostgreSQL database before two replicas: a conversation
moves between them, a reconnect resumes on the other front, and a front killed mid-answer
loses no stored turn (the answer is stored as interrupted, as a restart does on one box)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cluster.fake import FakeReplica
from tests.pg import PgServer
from tests.served import Served
from tests.sse import Event, parse_sse

PACE_S = 0.05  # one token every 50 ms at each replica


@pytest.fixture(scope="module")
def fronts(
    tmp_path_factory: pytest.TempPathFactory, postgres: PgServer, tiny_gguf: Path
) -> Iterator[tuple[Served, Served, str]]:
    """Fronts A and B on one database, both routing to the same two replicas; a user's key."""
    url = postgres.fresh_database()
    with (
        FakeReplica("slow", slots=8, pace_s=PACE_S) as one,
        FakeReplica("slow", slots=8, pace_s=PACE_S) as two,
    ):
        args = ("--replica", one.url, "--replica", two.url, "--no-local")
        env = {"CHATBOX_DATABASE_URL": url, "CHATBOX_REPLICA_HEALTH_S": "0.3"}
        a = Served(tmp_path_factory.mktemp("front-a"), model=tiny_gguf, args=args, env=env)
        b = Served(tmp_path_factory.mktemp("front-b"), model=tiny_gguf, args=args, env=env)
        a.start()
        try:
            b.start()
            try:
                yield a, b, a.user("ann")
            finally:
                b.kill()
        finally:
            a.kill()


def _tokens(events: list[Event]) -> str:
    return "".join(e.json()["text"] for e in events if e.event == "token")


def _turns(box: Served, key: str, conv: str) -> list[dict[str, Any]]:
    resp = httpx.get(f"{box.url}/v1/conversations/{conv}", headers=box.auth(key), timeout=30)
    assert resp.status_code == 200, resp.text
    return list(resp.json()["turns"])


def test_a_conversation_started_on_one_front_continues_on_the_other(
    fronts: tuple[Served, Served, str],
) -> None:
    a, b, key = fronts
    conv = a.conversation(key)
    with a.turn(key, conv, "first, on A", 40) as (_, events):
        # While A writes the answer, B refuses a second one in the same conversation, as
        # one front does.
        busy = httpx.post(
            f"{b.url}/v1/conversations/{conv}/turns",
            headers=b.auth(key),
            json={"content": "meanwhile, on B"},
            timeout=30,
        )
        assert busy.status_code == 409, busy.text
        seen = list(events)
    assert seen[-1].event == "done" and seen[-1].json()["status"] == "complete"
    with b.turn(key, conv, "second, on B", 5) as (_, events):
        assert list(events)[-1].json()["status"] == "complete"
    turns = _turns(a, key, conv)
    assert [(t["role"], t["content"]) for t in turns][::2] == [
        ("user", "first, on A"),
        ("user", "second, on B"),
    ]
    assert turns[1]["content"] == _tokens(seen) and turns[1]["status"] == "complete"
    assert [t["parent_id"] for t in turns[1:]] == [t["id"] for t in turns[:-1]]


def test_an_answer_streaming_on_one_front_resumes_on_the_other(
    fronts: tuple[Served, Served, str],
) -> None:
    a, b, key = fronts
    conv = a.conversation(key)
    with a.turn(key, conv, "a long one, please", 100) as (resp, events):
        turn = resp.headers["x-turn-id"]
        first: list[Event] = []
        for event in events:
            first.append(event)
            if event.event == "token" and len(_tokens(first)) > 20:
                break  # the client drops its connection to A here
    assert first[-1].id is not None
    # B's view of the conversation shows the answer A is writing (a page load there streams it).
    view = httpx.get(f"{b.url}/v1/conversations/{conv}", headers=b.auth(key), timeout=30)
    assert view.json()["running_turn_id"] == turn
    # It reconnects to B, saying the last event it saw; A is still writing (five seconds).
    rest: list[Event] = []
    with httpx.stream(
        "GET",
        f"{b.url}/v1/conversations/{conv}/turns/{turn}/events",
        headers={**b.auth(key), "Last-Event-ID": first[-1].id},
        timeout=180,
    ) as resumed:
        assert resumed.status_code == 200, resumed.read().decode()
        rest = list(parse_sse(resumed.iter_lines()))
    assert rest and rest[0].id == str(int(first[-1].id) + 1)
    assert rest[-1].event == "done" and rest[-1].json()["status"] == "complete"
    answer = _tokens(first) + _tokens(rest)
    assert answer == "word " * 100  # every token once, none lost or repeated
    # The reader on B kept the answer going past A's disconnect grace: stored complete.
    stored = _turns(b, key, conv)[-1]
    assert stored["id"] == turn and stored["status"] == "complete"
    assert stored["content"] == answer


def test_a_front_killed_mid_answer_loses_no_stored_turn(
    fronts: tuple[Served, Served, str],
) -> None:
    a, b, key = fronts
    conv = a.conversation(key)
    with a.turn(key, conv, "a short one", 3) as (_, events):
        assert list(events)[-1].json()["status"] == "complete"
    before = _turns(b, key, conv)
    seen: list[Event] = []
    on_b: list[Event] = []
    with a.turn(key, conv, "a very long one", 400) as (resp, events):
        turn = resp.headers["x-turn-id"]
        started = time.monotonic()
        for event in events:  # past a draft save (every 0.5 s), so text is stored
            seen.append(event)
            if time.monotonic() - started > 1.5:
                break
        # A second reader follows the answer on B, from where the first one is.
        follower = threading.Thread(target=lambda: on_b.extend(_follow(b, key, conv, turn, seen)))
        follower.start()
        time.sleep(1.0)
        a.kill()  # mid-answer: about 20 s of it left
    follower.join(timeout=30)
    assert not follower.is_alive(), "B's reader never heard how the answer ended"
    assert on_b and on_b[-1].event == "done", on_b[-3:]
    assert on_b[-1].json()["status"] == "interrupted"
    turns = _turns(b, key, conv)
    assert turns[: len(before)] == before  # every earlier turn still there
    question, answer = turns[len(before) :]
    assert question["content"] == "a very long one"
    assert answer["id"] == turn and answer["status"] == "interrupted"
    # The text saved so far is kept: what the readers were shown, up to the last save.
    shown = _tokens(seen) + _tokens(on_b)
    assert answer["content"] and shown.startswith(answer["content"])
    # The conversation goes on, on B.
    with b.turn(key, conv, "and now?", 3) as (_, events):
        assert list(events)[-1].json()["status"] == "complete"


def _follow(box: Served, key: str, conv: str, turn: str, seen: list[Event]) -> list[Event]:
    with httpx.stream(
        "GET",
        f"{box.url}/v1/conversations/{conv}/turns/{turn}/events",
        headers={**box.auth(key), "Last-Event-ID": seen[-1].id or "0"},
        timeout=180,
    ) as resp:
        if resp.status_code != 200:
            return [Event(None, "http", resp.read().decode())]
        return list(parse_sse(resp.iter_lines()))
