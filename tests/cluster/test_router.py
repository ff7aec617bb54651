"""Router mode on loopback: answers through the front from `chatbox replica` processes."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from chatbox.cluster.fleet import weight
from tests.cluster.conftest import TOKEN, Replica, front
from tests.conftest import as_stored
from tests.observability.test_telemetry import sample
from tests.sse import parse_sse


def ask(url: str, headers: dict[str, str], conv: str, text: str, **opts: Any) -> dict[str, Any]:
    """One turn over SSE: the streamed text and the final event's data."""
    body = {"content": text, **opts}
    streamed = ""
    with httpx.stream(
        "POST", f"{url}/v1/conversations/{conv}/turns", json=body, headers=headers, timeout=60
    ) as resp:
        assert resp.status_code == 200, resp.read()
        for event in parse_sse(resp.iter_lines()):
            if event.event == "token":
                streamed += event.json()["text"]
            elif event.event in ("done", "error"):
                return {"kind": event.event, "text": streamed, **event.json()}
    raise AssertionError("the stream ended without done")


def new_conversation(url: str, headers: dict[str, str]) -> str:
    resp = httpx.post(f"{url}/v1/conversations", json={}, headers=headers)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


def fleet(url: str, headers: dict[str, str]) -> dict[str, dict[str, Any]]:
    resp = httpx.get(f"{url}/v1/admin/replicas", headers=headers)
    assert resp.status_code == 200, resp.text
    return {r["url"]: r for r in resp.json()["replicas"]}


def stored_assistant_turns(url: str, headers: dict[str, str], conv: str) -> list[dict[str, Any]]:
    turns = httpx.get(f"{url}/v1/conversations/{conv}", headers=headers).json()["turns"]
    return [t for t in turns if t["role"] == "assistant"]


def test_answers_stream_through_the_front(data_dir: Path, shared_replicas: list[Replica]) -> None:
    with front(data_dir, [r.url for r in shared_replicas]) as server:
        conv = new_conversation(server.url, server.headers)
        out = ask(server.url, server.headers, conv, "hello there", max_tokens=12)
        assert out["kind"] == "done" and out["status"] == "complete"
        assert out["text"] and out["usage"]["completion_tokens"] == 12
        [turn] = stored_assistant_turns(server.url, server.headers, conv)
        assert turn["content"] == as_stored(out["text"])
        states = {r["state"] for r in fleet(server.url, server.headers).values()}
        assert states == {"healthy"}


def preferred(conv: str, urls: list[str]) -> str:
    """The replica rendezvous hashing sends this conversation to first."""
    return max(urls, key=lambda url: weight(conv, url))


def failovers(url: str, headers: dict[str, str]) -> float:
    text = httpx.get(f"{url}/metrics", headers=headers).text
    lines = [x for x in text.splitlines() if x.startswith("chatbox_replica_failovers_total")]
    return sum(float(x.rsplit(" ", 1)[1]) for x in lines)


def test_kill_9_mid_answer_continues_on_another_replica(
    data_dir: Path, shared_replicas: list[Replica]
) -> None:
    by_url = {r.url: r for r in shared_replicas}
    with front(data_dir, list(by_url)) as server:
        conv = new_conversation(server.url, server.headers)
        serving = preferred(conv, list(by_url))
        body = {"content": "tell me a long story", "max_tokens": 4000}
        streamed, final = "", None
        with httpx.stream(
            "POST",
            f"{server.url}/v1/conversations/{conv}/turns",
            json=body,
            headers=server.headers,
            timeout=60,
        ) as resp:
            for event in parse_sse(resp.iter_lines()):
                if event.event == "token":
                    if not streamed:
                        by_url[serving].kill()  # at the first token: mid-answer
                    streamed += event.json()["text"]
                elif event.event in ("done", "error"):
                    final = {"kind": event.event, **event.json()}
                    break
        assert final is not None
        assert final["kind"] == "done" and final["status"] == "complete", final
        assert failovers(server.url, server.headers) == 1  # it did move, once
        metrics = httpx.get(f"{server.url}/metrics", headers=server.headers).text
        assert sample(metrics, "chatbox_replica_failovers_total", replica=serving) == 1
        # Continuous: the answer ran to its full length, charged once for what was received.
        assert final["finish_reason"] == "length"
        assert final["usage"]["completion_tokens"] >= 3900
        [turn] = stored_assistant_turns(server.url, server.headers, conv)
        assert turn["content"] == as_stored(streamed)
        assert fleet(server.url, server.headers)[serving]["state"] in ("ejected", "down")


@pytest.mark.timeout(600)
def test_follow_up_turns_land_where_their_prefix_is_cached(
    data_dir: Path, shared_replicas: list[Replica]
) -> None:
    with front(data_dir, [r.url for r in shared_replicas]) as server:
        convs = [new_conversation(server.url, server.headers) for _ in range(20)]
        previous: dict[str, dict[str, Any]] = {}
        hits = follow_ups = 0
        for turn in range(3):
            for conv in convs:
                out = ask(server.url, server.headers, conv, f"turn {turn} of {conv}", max_tokens=6)
                assert out["status"] == "complete"
                if conv in previous:
                    follow_ups += 1
                    # The whole previous prompt (its user message too, not just the chat
                    # template) came from this replica's cache.
                    hits += out["usage"]["cached_tokens"] >= previous[conv]["prompt_tokens"]
                previous[conv] = out["usage"]
        assert follow_ups == 40
        assert hits / follow_ups >= 0.9, f"{hits} of {follow_ups} follow-ups hit the cache"
        served = [r["served"] for r in fleet(server.url, server.headers).values()]
        assert all(n > 0 for n in served), served  # the conversations were spread out


def test_drain_stops_new_work_and_lets_running_answers_finish(
    data_dir: Path, shared_replicas: list[Replica]
) -> None:
    from click.testing import CliRunner

    from chatbox.cli import main

    with front(data_dir, [r.url for r in shared_replicas[:2]]) as server:
        conv = new_conversation(server.url, server.headers)
        busy = [preferred(conv, [r.url for r in shared_replicas[:2]])]
        result: dict[str, Any] = {}
        worker = threading.Thread(
            target=lambda: result.update(
                ask(server.url, server.headers, conv, "a long one", max_tokens=4000)
            )
        )
        worker.start()
        deadline = time.monotonic() + 20
        while not fleet(server.url, server.headers)[busy[0]]["running"]:
            assert time.monotonic() < deadline and not result, "the answer never ran there"
            time.sleep(0.01)
        cli = ["replicas", "--front", server.url, "--key", server.api_key]
        out = CliRunner().invoke(main, [*cli, "drain", busy[0]])
        assert out.exit_code == 0, out.output
        assert "draining" in out.output
        worker.join(timeout=60)
        assert result["status"] == "complete" and result["usage"]["completion_tokens"] >= 3900
        before = fleet(server.url, server.headers)[busy[0]]["served"]
        assert before == 1  # the running answer finished on the draining replica
        for i in range(6):
            c = new_conversation(server.url, server.headers)
            assert ask(server.url, server.headers, c, f"q{i}", max_tokens=4)["status"] == "complete"
        assert fleet(server.url, server.headers)[busy[0]]["served"] == before
        listing = CliRunner().invoke(main, [*cli, "list"])
        assert listing.exit_code == 0 and "draining" in listing.output


def test_a_replica_refuses_requests_without_its_token(shared_replicas: list[Replica]) -> None:
    url = shared_replicas[0].url + "/v1/replica/generate"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(url, json=body).status_code == 401
    wrong = {"Authorization": "Bearer not-the-secret"}
    assert httpx.post(url, json=body, headers=wrong).status_code == 401
    right = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.post(url, json=body, headers=right).status_code == 200


def test_a_replica_without_a_token_listens_on_loopback_only(replica_dir: Path) -> None:
    from click.testing import CliRunner

    from chatbox.cli import main

    args = ["--data-dir", str(replica_dir), "replica", "--host", "0.0.0.0", "--model", "tiny"]
    out = CliRunner().invoke(main, args, env={"CHATBOX_REPLICA_TOKEN": ""})
    assert out.exit_code != 0 and "without a token" in out.output


def test_a_front_without_the_token_gets_no_healthy_replica(
    data_dir: Path, shared_replicas: list[Replica]
) -> None:
    with front(data_dir, [shared_replicas[0].url], replica_token="wrong") as server:
        [view] = fleet(server.url, server.headers).values()
        assert view["state"] == "down" and "401" in view["last_error"]
        conv = new_conversation(server.url, server.headers)
        resp = httpx.post(
            f"{server.url}/v1/conversations/{conv}/turns",
            json={"content": "hi"},
            headers=server.headers,
            timeout=30,
        )
        assert resp.status_code == 503 and "no healthy replica" in resp.text, resp.text
        assert stored_assistant_turns(server.url, server.headers, conv) == []


def test_an_answer_too_long_to_continue_elsewhere_ends_at_length(data_dir: Path) -> None:
    """A replica drops an answer; the next cannot fit the answer so far in its context (its
    text can take more tokens than were written): the answer ends there, at length, and is
    kept, rather than failing."""
    from tests.cluster.fake import FULL_AFTER, FakeReplica

    with (
        FakeReplica("full", pace_s=0.01) as a,
        FakeReplica("full", pace_s=0.01) as b,
        front(data_dir, [a.url, b.url]) as server,
    ):
        conv = new_conversation(server.url, server.headers)
        pool = ThreadPoolExecutor(1)  # not waited for: a stuck reader ends with the front
        asked = pool.submit(
            ask, server.url, server.headers, conv, "tell me a long story", max_tokens=4000
        )
        try:
            out = asked.result(timeout=120)
        except TimeoutError:  # say where the answer stands (a reader would wait for ever)
            turns = stored_assistant_turns(server.url, server.headers, conv)
            raise AssertionError(
                f"no end in 120 s; replicas {fleet(server.url, server.headers)}; calls"
                f" {a.generate_calls}, {b.generate_calls}; running {a.running}, {b.running};"
                f" stored {turns}"
            ) from None
        finally:
            pool.shutdown(wait=False)
        assert out["status"] == "complete" and out["finish_reason"] == "length", out
        assert out["usage"]["completion_tokens"] == FULL_AFTER
        assert a.generate_calls + b.generate_calls == 2  # the start, and the continuation
        [turn] = stored_assistant_turns(server.url, server.headers, conv)
        assert turn["content"] == "word " * FULL_AFTER


@pytest.mark.parametrize("misbehaviour", ["hang", "garbage"])
def test_a_hanging_or_garbage_replica_is_ejected_without_hanging_the_front(
    data_dir: Path, shared_replicas: list[Replica], misbehaviour: str
) -> None:
    from tests.cluster.fake import FakeReplica

    with (
        FakeReplica(misbehaviour) as bad,
        front(data_dir, [bad.url, shared_replicas[0].url]) as server,
    ):
        for i in range(24):  # about half of them hash to the bad one first
            if i >= 8 and bad.generate_calls:
                break  # (eight in a row hash to the good one once in 256 runs)
            started = time.monotonic()
            conv = new_conversation(server.url, server.headers)
            out = ask(server.url, server.headers, conv, f"question {i}", max_tokens=6)
            assert out["status"] == "complete", out
            # At worst one deadline (2 s) on the bad replica, then the good one answers; the
            # bound leaves room for a loaded 2-core CI machine (seen: 10.2 s) while a front
            # that waited on the bad replica would never answer at all.
            assert time.monotonic() - started < 30
        view = fleet(server.url, server.headers)[bad.url]
        assert bad.generate_calls >= 1 and view["last_error"]
        expected = "no reply within 2 s" if misbehaviour == "hang" else "not an event"
        assert expected in view["last_error"]
