"""Erasing a conversation reaches the replicas: the KV it left there is dropped too."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx

from chatbox.cluster.erasure import FORGET_TIMEOUT_S
from tests.cluster.conftest import TOKEN, Replica, front
from tests.cluster.test_router import ask, new_conversation, preferred


def cached(replicas: list[Replica]) -> dict[str, int]:
    """Each replica's cached conversations, as its stats endpoint reports them."""
    return {r.url: r.stats()["cached_prefixes"] for r in replicas}


def settled(replicas: list[Replica], want: dict[str, int]) -> dict[str, int]:
    """The counts once every answer's slot is released (the done event may come first)."""
    deadline = time.monotonic() + 10
    while (now := cached(replicas)) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    return now


def delete(url: str, headers: dict[str, str], conv: str) -> float:
    """Delete the conversation; return how long the delete took."""
    start = time.monotonic()
    resp = httpx.delete(f"{url}/v1/conversations/{conv}", headers=headers, timeout=30)
    assert resp.status_code == 204, resp.text
    return time.monotonic() - start


def test_deleting_a_conversation_drops_its_kv_on_the_replicas(
    data_dir: Path, replicas: list[Replica]
) -> None:
    urls = [r.url for r in replicas]
    with front(data_dir, urls) as server:
        convs = [new_conversation(server.url, server.headers) for _ in range(2)]
        want = dict.fromkeys(urls, 0)
        for conv in convs:
            out = ask(server.url, server.headers, conv, f"remember {conv}", max_tokens=8)
            assert out["kind"] == "done", out
            want[preferred(conv, urls)] += 1
        assert settled(replicas, want) == want

        # The delete returns once the replica has dropped the KV: nothing to wait for.
        first, second = convs
        delete(server.url, server.headers, first)
        want[preferred(first, urls)] -= 1
        assert cached(replicas) == want

        # A replica that hangs (stopped, still counted healthy) misses the call; the delete
        # waits for it a short while only, and the replica holding the KV drops it anyway.
        holder = preferred(second, urls)
        hung = next(r for r in replicas if r.url != holder)
        hung.proc.send_signal(signal.SIGSTOP)
        try:
            took = delete(server.url, server.headers, second)
        finally:
            hung.proc.send_signal(signal.SIGCONT)
        assert took < FORGET_TIMEOUT_S + 3
        want[holder] -= 1
        assert cached(replicas) == dict.fromkeys(urls, 0) == want


def test_a_forget_call_needs_the_replica_token(data_dir: Path, replica: Replica) -> None:
    with front(data_dir, [replica.url]) as server:
        conv = new_conversation(server.url, server.headers)
        assert ask(server.url, server.headers, conv, "hello", max_tokens=8)["kind"] == "done"
    assert settled([replica], {replica.url: 1}) == {replica.url: 1}

    forget = replica.url + "/v1/replica/forget"
    body = {"model": "tiny", "cache_keys": [conv]}
    for headers in ({}, {"Authorization": "Bearer not-the-token"}, {"Authorization": TOKEN}):
        resp = httpx.post(forget, json=body, headers=headers)
        assert resp.status_code == 401, resp.text
    assert cached([replica]) == {replica.url: 1}  # nothing was dropped

    auth = replica.headers
    assert httpx.post(forget, json={"cache_keys": "x"}, headers=auth).status_code == 400
    other = {"model": "other", "cache_keys": [conv]}
    assert httpx.post(forget, json=other, headers=auth).status_code == 404
    # With the token (and no model: every model it serves) the conversation's KV goes.
    resp = httpx.post(forget, json={"model": None, "cache_keys": [conv]}, headers=auth)
    assert resp.status_code == 200 and resp.json()["models"] == ["tiny"], resp.text
    assert cached([replica]) == {replica.url: 0}


def test_a_delete_reaches_replicas_that_are_all_draining(data_dir: Path, replica: Replica) -> None:
    """A draining replica takes no new work but keeps the KV it holds: when every replica
    of the model drains (none can take the model now), a deletion still drops it there."""
    from click.testing import CliRunner

    from chatbox.cli import main

    with front(data_dir, [replica.url]) as server:
        conv = new_conversation(server.url, server.headers)
        assert ask(server.url, server.headers, conv, "hello", max_tokens=8)["kind"] == "done"
        assert settled([replica], {replica.url: 1}) == {replica.url: 1}
        cli = ["replicas", "--front", server.url, "--key", server.api_key]
        out = CliRunner().invoke(main, [*cli, "drain", replica.url])
        assert out.exit_code == 0 and "draining" in out.output, out.output
        delete(server.url, server.headers, conv)
        assert cached([replica]) == {replica.url: 0}


def test_deleting_an_account_drops_its_stateless_kv_on_the_replicas(
    data_dir: Path, replica: Replica
) -> None:
    """A stateless completion's KV has a key nobody keeps; the account's erasure reaches it
    on the replica by the account's cache scope."""
    from tests.conftest import bearer, seed_user

    with front(data_dir, [replica.url]) as server:
        member = bearer(seed_user(server.settings, "zoe", role="member"))
        body = {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        done = httpx.post(server.url + "/v1/chat/completions", json=body, headers=member)
        assert done.status_code == 200, done.text
        assert settled([replica], {replica.url: 1}) == {replica.url: 1}
        gone = httpx.delete(server.url + "/v1/admin/users/zoe", headers=server.headers)
        assert gone.status_code == 204, gone.text
        assert cached([replica]) == {replica.url: 0}
