"""The fleet's capacity: admission over all replicas' slots, the local engine in the ring,
spill past a replica's queue limit, bounded load for bursts of new conversations."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

from chatbox.cluster.local import LOCAL
from tests.cluster.conftest import Replica, front
from tests.cluster.fake import FakeReplica
from tests.cluster.test_router import (
    ask,
    fleet,
    new_conversation,
    preferred,
    stored_assistant_turns,
)
from tests.conftest import LiveServer
from tests.sse import Event, parse_sse

# The admin's tier (paid) is shed past the high-water mark, which defaults to the slots.
POLICY = """
[tiers.paid]
rpm = 1000
tpm = 10000000
max_streams = 10
model = "tiny"
overload = "shed"

[overload]
high_water = 0
retry_after_s = 3
"""


def shedding_policy(data_dir: Path) -> Path:
    path = data_dir.parent / "shed-policy.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(POLICY)
    return path


@contextmanager
def answering(server: LiveServer, conv: str) -> Iterator[Iterator[Event]]:
    """A long answer, open until the block ends (it is stopped then), from its first token."""
    body = {"content": "a very long story", "max_tokens": 4000}
    url = f"{server.url}/v1/conversations/{conv}/turns"
    with httpx.stream("POST", url, json=body, headers=server.headers, timeout=60) as resp:
        assert resp.status_code == 200, resp.read()
        events = parse_sse(resp.iter_lines())
        for event in events:
            assert event.event not in ("done", "error"), event.data
            if event.event == "token":
                break
        try:
            yield events
        finally:
            httpx.post(f"{server.url}/v1/conversations/{conv}/cancel", headers=server.headers)


def refused(server: LiveServer) -> httpx.Response:
    conv = new_conversation(server.url, server.headers)
    body = {"content": "one more", "max_tokens": 4}
    url = f"{server.url}/v1/conversations/{conv}/turns"
    return httpx.post(url, json=body, headers=server.headers, timeout=60)


def wait_idle(server: LiveServer) -> None:
    deadline = time.monotonic() + 10
    while any(r["running"] or r["queued"] for r in fleet(server.url, server.headers).values()):
        assert time.monotonic() < deadline, "the stopped answers still run"
        time.sleep(0.05)


def wait_stored(server: LiveServer, conv: str) -> None:
    """Until the conversation's answer is stored (an answer is stored once, when it ends)."""
    deadline = time.monotonic() + 10
    while not stored_assistant_turns(server.url, server.headers, conv):
        assert time.monotonic() < deadline, "the stopped answer was not stored"
        time.sleep(0.05)


def conversations_for(server: LiveServer, members: list[str], each: int) -> list[str]:
    """New conversations, `each` of them hashing first to each member, in member order."""
    found: dict[str, list[str]] = {m: [] for m in members}
    while any(len(v) < each for v in found.values()):
        conv = new_conversation(server.url, server.headers)
        target = found[preferred(conv, members)]
        if len(target) < each:
            target.append(conv)
    return [c for m in members for c in found[m]]


def wait_state(server: LiveServer, url: str, healthy: bool) -> None:
    deadline = time.monotonic() + 10
    while (fleet(server.url, server.headers)[url]["state"] == "healthy") != healthy:
        assert time.monotonic() < deadline, fleet(server.url, server.headers)[url]
        time.sleep(0.05)


def test_admission_counts_the_slots_of_every_healthy_replica(data_dir: Path) -> None:
    policy = shedding_policy(data_dir)
    with (
        FakeReplica("slow", slots=2) as a,
        FakeReplica("slow", slots=2) as b,
        front(data_dir, [a.url, b.url], policy_path=policy) as server,
    ):
        two = [a.url, b.url]
        assert [r["slots"] for r in fleet(server.url, server.headers).values()] == [2, 2]
        with ExitStack() as stack:
            for conv in conversations_for(server, two, 2):  # 2 + 2 slots: 4 answers at once
                stack.enter_context(answering(server, conv))
            assert (a.running, b.running) == (2, 2)
            shed = refused(server)
            assert shed.status_code == 503 and shed.headers["retry-after"] == "3", shed.text
        wait_idle(server)
        b.stop()  # gone: the fleet has two slots left
        wait_state(server, b.url, healthy=False)
        with ExitStack() as stack:
            for conv in conversations_for(server, two, 1):  # b's conversation moves to a
                stack.enter_context(answering(server, conv))
            assert a.running == 2
            assert refused(server).status_code == 503
        wait_idle(server)
        conv = new_conversation(server.url, server.headers)
        assert ask(server.url, server.headers, conv, "hi", max_tokens=4)["status"] == "complete"


def test_the_local_engine_is_a_member_of_the_ring(
    data_dir: Path, replica: Replica, tiny_gguf: Path
) -> None:
    with front(data_dir, [replica.url], local=tiny_gguf, n_parallel=2) as server:
        members = fleet(server.url, server.headers)
        assert members[LOCAL]["kind"] == "local" and members[LOCAL]["slots"] == 2
        assert members[LOCAL]["state"] == "healthy" and members[LOCAL]["models"] == ["tiny"]
        # Affinity covers it: each conversation's turns stay on the member it hashes to,
        # where the previous turn is cached.
        convs = conversations_for(server, [LOCAL, replica.url], 2)
        previous: dict[str, dict[str, Any]] = {}
        for turn in range(2):
            for conv in convs:
                out = ask(server.url, server.headers, conv, f"turn {turn}", max_tokens=6)
                assert out["status"] == "complete", out
                if conv in previous:
                    assert out["usage"]["cached_tokens"] >= previous[conv]["prompt_tokens"]
                previous[conv] = out["usage"]
        served = {u: r["served"] for u, r in fleet(server.url, server.headers).items()}
        assert served == {LOCAL: 4, replica.url: 4}


def test_admission_counts_the_local_engine_with_the_replicas(
    data_dir: Path, tiny_gguf: Path
) -> None:
    from click.testing import CliRunner

    from chatbox.cli import main

    policy = shedding_policy(data_dir)
    with (
        FakeReplica("slow", slots=2) as remote,
        front(data_dir, [remote.url], local=tiny_gguf, n_parallel=2, policy_path=policy) as server,
    ):
        here, _, there, also_there = conversations_for(server, [LOCAL, remote.url], 2)
        cli = ["replicas", "--front", server.url, "--key", server.api_key]
        for conv in (there, also_there):  # one at a time: each lands where it hashes first
            assert ask(server.url, server.headers, conv, "hi", max_tokens=2)["status"]
        # ...and its next turn follows it there, even while that takes both of its slots.
        with answering(server, there), answering(server, also_there):
            assert remote.running == 2  # the replica's slots are full, the local ones free
            out = ask(server.url, server.headers, here, "hello", max_tokens=6)
            assert out["status"] == "complete"
            assert fleet(server.url, server.headers)[LOCAL]["served"] == 1
            drained = CliRunner().invoke(main, [*cli, "drain", LOCAL])
            assert drained.exit_code == 0 and "draining" in drained.output, drained.output
            assert refused(server).status_code == 503  # the replica's 2 slots are all left
            undone = CliRunner().invoke(main, [*cli, "drain", "--undo", LOCAL])
            assert undone.exit_code == 0, undone.output
            out = ask(server.url, server.headers, here, "again", max_tokens=6)
            assert out["status"] == "complete"
            assert fleet(server.url, server.headers)[LOCAL]["served"] == 2


def spills(server: LiveServer) -> float:
    text = httpx.get(f"{server.url}/metrics", headers=server.headers).text
    lines = [x for x in text.splitlines() if x.startswith("chatbox_replica_spills_total")]
    return sum(float(x.rsplit(" ", 1)[1]) for x in lines)


def test_a_replica_past_its_queue_limit_spills_to_the_next_in_hash_order(
    data_dir: Path,
) -> None:
    with (
        FakeReplica("slow", slots=1) as x,
        FakeReplica("slow", slots=1) as y,
        front(data_dir, [x.url, y.url], replica_queue_limit=0) as server,
    ):
        first, second = conversations_for(server, [x.url, y.url], 2)[:2]  # both prefer x
        with answering(server, first):  # x's one slot is taken, and it may queue none
            out = ask(server.url, server.headers, second, "hello", max_tokens=6)
            assert out["status"] == "complete"
            # A cold prefill on the next replica in hash order rather than a wait.
            assert (x.generate_calls, y.generate_calls) == (1, 1)
            assert spills(server) == 1
        wait_idle(server)
        # x is free again, but the conversation's KV is on y now: its next turn follows it.
        assert ask(server.url, server.headers, second, "again", max_tokens=6)["status"]
        assert (x.generate_calls, y.generate_calls) == (1, 2) and spills(server) == 1


def test_a_burst_of_new_conversations_spreads_over_the_fleet(data_dir: Path) -> None:
    with (
        FakeReplica("slow", slots=4) as x,
        FakeReplica("slow", slots=4) as y,
        front(data_dir, [x.url, y.url]) as server,
    ):
        # all four prefer x (four: the admin's tier writes up to four answers at once)
        convs = conversations_for(server, [x.url, y.url], 4)[:4]
        with ExitStack() as stack:
            for conv in convs:
                stack.enter_context(answering(server, conv))
            load = fleet(server.url, server.headers)
            running = {url: load[url]["running"] + load[url]["queued"] for url in (x.url, y.url)}
            # x takes a new conversation only while under its half of the load, although x
            # is every one's first choice and has room for them all (4 slots + a queue of
            # 4): the second goes to y (x has 1 of 2, its share is ceil(2 / 2) = 1), the
            # third to x, the fourth to y.
            assert running == {x.url: 2, y.url: 2}, running
        wait_idle(server)
        for conv in convs:  # a stopped answer is stored just after its replica lets go
            wait_stored(server, conv)
        # Each conversation's next turn goes where its first answer (and its KV) went.
        before = (x.generate_calls, y.generate_calls)
        for conv in convs:
            assert ask(server.url, server.headers, conv, "again", max_tokens=4)["status"]
        after = (x.generate_calls - before[0], y.generate_calls - before[1])
        assert after == (running[x.url], running[y.url])
