"""Two `chatbox serve` fronts on one PostgreSQL database share one fleet: each sees the load
the other puts on a replica (an OpenAI-kind one's too), a conversation placed off its hash
order on one continues on the same replica from the other, a replica added, drained or
removed on one is so on the other, and a conversation both summarise is summarised once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from chatbox.cluster.fleet import weight
from tests.cluster.fake import FakeReplica
from tests.cluster.fake_openai import FakeOpenAI
from tests.pg import PgServer
from tests.served import Served

T = TypeVar("T")
Replica = FakeReplica | FakeOpenAI
PACE_S = 0.05  # one token every 50 ms at each replica
WAIT_S = 20.0  # the most a change may take to reach the other front (it takes ~0.3 s)
ABSENT_S = 5.0  # how long a request that should not come is waited for (it comes in ~0.1 s)


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, postgres: PgServer, tiny_gguf: Path
) -> Iterator[tuple[Served, Served, FakeReplica, FakeReplica, str]]:
    """Fronts A and B on one database before two one-slot replicas; a user's key."""
    url = postgres.fresh_database()
    with (
        FakeReplica("slow", slots=1, pace_s=PACE_S, report_load=True, background_fast=True) as r1,
        FakeReplica("slow", slots=1, pace_s=PACE_S, report_load=True, background_fast=True) as r2,
    ):
        args = ("--replica", r1.url, "--replica", r2.url, "--no-local")
        env = {
            "CHATBOX_DATABASE_URL": url,
            "CHATBOX_REPLICA_HEALTH_S": "0.3",
            "CHATBOX_SUMMARY_AT": "0.05",  # ~200 of the replicas' 4,096 tokens
        }
        a = Served(tmp_path_factory.mktemp("front-a"), model=tiny_gguf, args=args, env=env)
        b = Served(tmp_path_factory.mktemp("front-b"), model=tiny_gguf, args=args, env=env)
        with a, b:
            key = a.user("ann", tier="paid")
            for box in (a, b):  # each front's first answer loads what answers need
                assert _ask(box, key, box.conversation(key), "hi", 1) == "complete"
            yield a, b, r1, r2, key


def _until(probe: Callable[[], T], done: Callable[[T], bool], wait_s: float = WAIT_S) -> T:
    """Probe until done (or wait_s passed); the last value."""
    deadline = time.monotonic() + wait_s
    value = probe()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(0.1)
        value = probe()
    return value


def _replicas(box: Served) -> dict[str, dict[str, Any]]:
    resp = httpx.get(box.url + "/v1/admin/replicas/", headers=box.admin, timeout=30)
    assert resp.status_code == 200, resp.text
    return {r["url"]: r for r in resp.json()["replicas"]}


def _ask(box: Served, key: str, conv: str, text: str, max_tokens: int) -> str:
    """A turn, read to its end; the answer's status."""
    with box.turn(key, conv, text, max_tokens) as (_, stream):
        events = list(stream)
    assert events[-1].event == "done", events[-3:]
    return str(events[-1].json()["status"])


def _in_background(box: Served, key: str, conv: str, max_tokens: int) -> threading.Thread:
    thread = threading.Thread(target=_ask, args=(box, key, conv, "a long one", max_tokens))
    thread.start()
    return thread


def _hashed_to(box: Served, key: str, replica: Replica, among: list[Replica]) -> str:
    """A new conversation whose rendezvous hash order puts `replica` first."""
    for _ in range(64):
        conv = box.conversation(key)
        if max(among, key=lambda r: weight(conv, r.url)) is replica:
            return conv
    raise AssertionError("no conversation hashed to the replica")


def test_a_front_sees_the_load_another_front_puts_on_the_replicas(
    fleet: tuple[Served, Served, FakeReplica, FakeReplica, str],
) -> None:
    a, b, r1, r2, key = fleet
    streams = [_in_background(a, key, a.conversation(key), 80) for _ in range(2)]
    try:
        assert _until(lambda: r1.running + r2.running, lambda n: n == 2) == 2
        # A has two answers running; B has none of its own, and its view counts A's.
        seen = _until(
            lambda: sum(r["running"] + r["queued"] for r in _replicas(b).values()),
            lambda n: n == 2,
        )
        assert seen == 2
    finally:
        for stream in streams:
            stream.join(timeout=60)
    # Once they end, B sees the replicas idle again.
    assert _until(lambda: sum(r["running"] for r in _replicas(b).values()), lambda n: n == 0) == 0


def test_a_conversation_placed_off_its_hash_order_continues_there_on_the_other_front(
    fleet: tuple[Served, Served, FakeReplica, FakeReplica, str],
) -> None:
    a, b, r1, r2, key = fleet
    idle = _until(lambda: sum(r["running"] for r in _replicas(a).values()), lambda n: n == 0)
    assert idle == 0  # A counts nothing left from earlier tests
    busy = _hashed_to(a, key, r1, [r1, r2])
    stream = _in_background(a, key, busy, 60)  # three seconds on r1, its hash order's first
    try:
        assert _until(lambda: busy in r1.cache_keys, bool)
        # A new conversation that hashes to r1 too: r1 is past its share, so it goes to r2.
        conv = _hashed_to(a, key, r1, [r1, r2])
        assert _ask(a, key, conv, "hello", 3) == "complete"
        assert conv in r2.cache_keys and conv not in r1.cache_keys
    finally:
        stream.join(timeout=60)
    # r1 is idle again; the conversation goes on, on B, where its prefix is cached: r2.
    assert _ask(b, key, conv, "and then?", 3) == "complete"
    assert r2.cache_keys.count(conv) == 2 and conv not in r1.cache_keys


def test_two_fronts_summarising_one_conversation_ask_the_model_once(
    fleet: tuple[Served, Served, FakeReplica, FakeReplica, str],
) -> None:
    a, b, r1, r2, key = fleet
    conv = a.conversation(key)
    r1.summaries_go.clear()
    r2.summaries_go.clear()
    try:
        # Past the summary threshold: A asks for a summary (held at the replica).
        assert _ask(a, key, conv, "tell me about it. " * 60, 3) == "complete"
        assert _until(lambda: r1.summaries + r2.summaries, lambda n: n >= 1) == 1
        # The next turn, on B, is stored while A's summary is being written.
        assert _ask(b, key, conv, "and more?", 3) == "complete"
        # B would ask at once, off the back of its answer; it leaves it to A.
        asked = _until(lambda: r1.summaries + r2.summaries, lambda n: n > 1, ABSENT_S)
        assert asked == 1
    finally:
        r1.summaries_go.set()
        r2.summaries_go.set()


def test_a_replica_drained_on_one_front_is_drained_on_the_other(
    fleet: tuple[Served, Served, FakeReplica, FakeReplica, str],
) -> None:
    a, b, r1, r2, key = fleet
    drain = httpx.post(
        a.url + "/v1/admin/replicas/drain", headers=a.admin, json={"url": r2.url}, timeout=30
    )
    assert drain.status_code == 200, drain.text
    try:
        state = _until(lambda: _replicas(b)[r2.url]["state"], lambda s: s == "draining")
        assert state == "draining"
        # A new conversation on B that hashes to r2 goes to r1.
        conv = _hashed_to(b, key, r2, [r1, r2])
        assert _ask(b, key, conv, "hello", 3) == "complete"
        assert conv in r1.cache_keys and conv not in r2.cache_keys
    finally:
        undo = httpx.post(
            a.url + "/v1/admin/replicas/drain",
            headers=a.admin,
            json={"url": r2.url, "undo": True},
            timeout=30,
        )
        assert undo.status_code == 200, undo.text
    assert _until(lambda: _replicas(b)[r2.url]["state"], lambda s: s == "healthy") == "healthy"


def test_a_replica_added_and_removed_on_one_front_is_so_on_the_other(
    fleet: tuple[Served, Served, FakeReplica, FakeReplica, str],
) -> None:
    a, b, _, _, _ = fleet
    with FakeReplica("slow", slots=2) as r3:
        added = httpx.post(
            a.url + "/v1/admin/replicas/", headers=a.admin, json={"url": r3.url}, timeout=30
        )
        assert added.status_code == 201, added.text
        # B adds it, then checks it (its slots are what it reports).
        seen = _until(lambda: _replicas(b).get(r3.url, {}), lambda r: r.get("state") == "healthy")
        assert seen.get("state") == "healthy"
        assert seen["source"] == "table" and seen["slots"] == 2
        removed = httpx.delete(
            a.url + "/v1/admin/replicas/", headers=a.admin, params={"url": r3.url}, timeout=30
        )
        assert removed.status_code == 200, removed.text
        assert _until(lambda: r3.url in _replicas(b), lambda there: not there) is False


def test_a_front_sees_the_load_another_front_puts_on_an_openai_kind_replica(
    fleet: tuple[Served, Served, FakeReplica, FakeReplica, str],
) -> None:
    a, b, r1, r2, key = fleet
    with FakeOpenAI("remote", pace_s=PACE_S) as server:
        body = {"url": server.url, "kind": "openai", "slots": 2, "models": ["tiny=remote"]}
        added = httpx.post(a.url + "/v1/admin/replicas/", headers=a.admin, json=body, timeout=30)
        assert added.status_code == 201, added.text
        assert added.json()["state"] == "healthy"
        try:
            state = _until(
                lambda: _replicas(b).get(server.url, {}).get("state"), lambda s: s == "healthy"
            )
            assert state == "healthy"
            conv = _hashed_to(a, key, server, [r1, r2, server])
            stream = _in_background(a, key, conv, 60)  # three seconds there
            try:
                assert _until(lambda: len(server.bodies), bool)
                # It reports no load; B learns A's count from the store.
                there = _until(lambda: _replicas(b)[server.url]["running"], lambda n: n == 1)
                assert there == 1
            finally:
                stream.join(timeout=60)
            assert _until(lambda: _replicas(b)[server.url]["running"], lambda n: n == 0) == 0
        finally:
            httpx.delete(a.url + "/v1/admin/replicas/", headers=a.admin, params={"url": server.url})
