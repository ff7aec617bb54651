"""Two fronts on one PostgreSQL database, before a replica that writes one word every 50 ms,
when the database or a front fails under a streaming answer: the answer streams through a
database outage and is stored whole once the database is back; a front whose liveness
connection is cut keeps its answers (the other front does not take them for dead); a front
killed mid-answer leaves its text stored at most a moment behind what was streamed, and a
reconnect to the other front gets how the answer ended from the database."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from chatbox.chat.policy import default_policy_path
from chatbox.store.run_channel import FRONT_LOCK
from tests.cluster.fake import FakeReplica
from tests.pg import PgServer, binaries
from tests.served import Served
from tests.sse import Event, parse_sse

pytestmark = pytest.mark.skipif(binaries() is None, reason="PostgreSQL is not installed")

PACE_S = 0.05  # one word every 50 ms
GRACE_S = 4  # a front without its liveness lock this long is taken for dead


@pytest.fixture(scope="module")
def database() -> Iterator[PgServer]:
    """A PostgreSQL server of this module's own: stopping it disturbs no other test."""
    server = PgServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def fronts(
    tmp_path_factory: pytest.TempPathFactory, database: PgServer, tiny_gguf: Path
) -> Iterator[tuple[Served, Served, str]]:
    """Fronts A and B on one database before one slow replica; a user's key."""
    root = tmp_path_factory.mktemp("faults")
    # Moderation off: this is about the store, and needs no classifiers trained first.
    policy = root / "policy.toml"
    policy.write_text(
        re.sub(
            r"(\[moderation\]\n(?:#.*\n)*)enabled = true",
            r"\g<1>enabled = false",
            default_policy_path().read_text(),
        )
    )
    url = database.fresh_database()
    with FakeReplica("slow", slots=8, pace_s=PACE_S) as replica:
        args = ("--replica", replica.url, "--no-local")
        env = {"CHATBOX_DATABASE_URL": url, "CHATBOX_FRONT_GRACE_S": str(GRACE_S)}
        (root / "a").mkdir()
        (root / "b").mkdir()
        a = Served(root / "a", model=tiny_gguf, policy=policy, args=args, env=env)
        b = Served(root / "b", model=tiny_gguf, policy=policy, args=args, env=env)
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


def _stored(box: Served, key: str, conv: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:  # right after an outage the first reads may still be refused (503)
        resp = httpx.get(f"{box.url}/v1/conversations/{conv}", headers=box.auth(key), timeout=30)
        if resp.status_code != 503 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["turns"][-1])


def _usage(box: Served) -> tuple[int, int]:
    """ann's requests and completion tokens, as `chatbox usage` counts them."""
    import json

    rows = json.loads(box.cli("usage", "--user", "ann", "--json"))["data"]
    return sum(r["requests"] for r in rows), sum(r["completion_tokens"] for r in rows)


def _follow(box: Served, key: str, conv: str, turn: str, after: str) -> list[Event]:
    with httpx.stream(
        "GET",
        f"{box.url}/v1/conversations/{conv}/turns/{turn}/events",
        headers={**box.auth(key), "Last-Event-ID": after},
        timeout=180,
    ) as resp:
        if resp.status_code != 200:
            return [Event(None, "http", f"{resp.status_code} {resp.read().decode()}")]
        return list(parse_sse(resp.iter_lines()))


async def _sql(url: str, query: str, *args: Any) -> Any:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetch(query, *args)
    finally:
        await conn.close()


def test_an_answer_streams_through_a_database_outage_and_is_stored_whole(
    fronts: tuple[Served, Served, str], database: PgServer
) -> None:
    a, _, key = fronts
    conv = a.conversation(key)
    seen: list[Event] = []
    with a.turn(key, conv, "a long one", 400) as (_, events):  # about 20 s of words
        started = time.monotonic()
        for event in events:
            seen.append(event)
            if time.monotonic() - started > 2:
                break
        database.halt()  # ten seconds without the database, mid-answer
        try:
            until = time.monotonic() + 10
            for event in events:
                seen.append(event)
                if time.monotonic() > until:
                    break
        finally:
            database.resume()
        seen.extend(events)
    assert seen[-1].event == "done", seen[-3:]
    assert seen[-1].json()["status"] == "complete"
    streamed = _tokens(seen)
    assert streamed == "word " * 400  # nothing lost or repeated on the way
    answer = _stored(a, key, conv)
    assert answer["status"] == "complete"
    assert answer["content"] == streamed  # what the client saw is what history holds


def test_a_cut_liveness_connection_does_not_end_the_fronts_answers(
    fronts: tuple[Served, Served, str],
) -> None:
    a, b, key = fronts
    conv = a.conversation(key)
    url = a.env["CHATBOX_DATABASE_URL"]
    seen: list[Event] = []
    on_b: list[Event] = []
    with a.turn(key, conv, "a long one", 200) as (resp, events):  # about 10 s of words
        turn = resp.headers["x-turn-id"]
        for event in events:
            seen.append(event)
            if event.event == "token":
                break
        # A second reader follows the answer on B (a mirror of A's).
        before_b = _tokens(seen)
        follower = threading.Thread(
            target=lambda: on_b.extend(_follow(b, key, conv, turn, seen[-1].id or "0"))
        )
        follower.start()
        time.sleep(1.0)
        [draft] = asyncio_run(_sql(url, "SELECT front FROM drafts WHERE id = $1", turn))
        cut = asyncio_run(
            _sql(
                url,
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
                " AND classid = $1 AND objid = $2 AND objsubid = 2",
                FRONT_LOCK,
                int(draft["front"]),
            )
        )
        assert len(cut) == 1  # A's liveness connection is gone
        seen.extend(events)
    follower.join(timeout=60)
    assert seen[-1].event == "done" and seen[-1].json()["status"] == "complete", seen[-3:]
    streamed = _tokens(seen)
    assert streamed == "word " * 200
    answer = _stored(b, key, conv)
    assert (answer["status"], answer["content"]) == ("complete", streamed)
    # B's reader saw the same answer end the same way.
    assert on_b and on_b[-1].event == "done", on_b[-3:]
    assert on_b[-1].json()["status"] == "complete"
    assert before_b + _tokens(on_b) == streamed
    assert "reconnected" in a.log()


def test_a_killed_fronts_answer_is_stored_a_moment_behind_and_resumes_on_the_other(
    fronts: tuple[Served, Served, str],
) -> None:
    a, b, key = fronts
    conv = a.conversation(key)
    charged = _usage(b)
    seen: list[tuple[float, Event]] = []
    with a.turn(key, conv, "a very long one", 400) as (resp, events):
        turn = resp.headers["x-turn-id"]
        started = time.monotonic()
        for event in events:
            seen.append((time.monotonic(), event))
            if time.monotonic() - started > 3:
                break
        killed = time.monotonic()
        a.kill()  # mid-answer: about 17 s of it left
        try:
            for event in events:  # whatever was on the way
                seen.append((time.monotonic(), event))
        except httpx.HTTPError:
            pass
    try:
        last = next(e.id for _, e in reversed(seen) if e.id is not None)
        assert last is not None
        # The client reconnects to B, naming the last event it saw.
        rest = _follow(b, key, conv, turn, last)
        assert rest and rest[-1].event == "done", rest
        assert rest[-1].json()["status"] == "interrupted"
        assert int(rest[0].id or 0) > int(last)
        answer = _stored(b, key, conv)
        assert answer["status"] == "interrupted"
        shown = _tokens([e for _, e in seen])
        # What was saved is what was shown, at most about half a second behind it.
        assert answer["content"] and shown.startswith(answer["content"])
        before = _tokens([e for at, e in seen if at < killed - 1.0])
        assert answer["content"].startswith(before), (len(answer["content"]), len(before))
        # Its front died before charging it: B's recovery did, with the tokens it had saved.
        words = len([e for _, e in seen if e.event == "token"])
        requests, completion = (now - then for now, then in zip(_usage(b), charged, strict=True))
        assert requests == 1 and 0 < completion <= words, (requests, completion, words)
        assert answer["usage"]["completion_tokens"] == completion
    finally:
        a.start()  # the module's other tests see two fronts again


def asyncio_run(coro: Any) -> Any:
    import asyncio

    return asyncio.run(coro)
