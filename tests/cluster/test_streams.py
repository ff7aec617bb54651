"""A replica's answer as the client sees it: resumed after a disconnect, stopped at once."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.cluster.conftest import Replica, front
from tests.cluster.test_router import new_conversation, stored_assistant_turns
from tests.conftest import as_stored
from tests.sse import Event, parse_sse


def turn_url(base: str, conv: str) -> str:
    return f"{base}/v1/conversations/{conv}/turns"


def test_last_event_id_resumes_an_answer_a_replica_is_writing(
    data_dir: Path, slow_replica: Replica
) -> None:
    serving = slow_replica
    with front(data_dir, [serving.url], disconnect_grace_s=10.0) as server:
        conv = new_conversation(server.url, server.headers)
        first: list[Event] = []
        body = {"content": "tell me about the sea", "max_tokens": 1000}
        with httpx.stream(
            "POST", turn_url(server.url, conv), json=body, headers=server.headers, timeout=60
        ) as resp:
            for event in parse_sse(resp.iter_lines()):
                first.append(event)
                if sum(e.event == "token" for e in first) == 5:
                    break
        # The client is gone; the replica goes on writing the answer meanwhile.
        assert serving.stats()["streams"] == 1
        turn_id = first[0].json()["turn_id"]
        resumed = httpx.get(
            f"{server.url}/v1/conversations/{conv}/turns/{turn_id}/events",
            headers={**server.headers, "Last-Event-ID": first[-1].id or ""},
            timeout=60,
        )
        assert resumed.status_code == 200
        rest = list(parse_sse(iter(resumed.text.split("\n"))))
        ids = [int(e.id or 0) for e in first + rest]
        assert ids == list(range(1, len(ids) + 1))  # no gap, no duplicate
        assert rest[-1].event == "done"
        done = rest[-1].json()
        assert done["status"] == "complete" and done["usage"]["completion_tokens"] == 1000
        text = "".join(e.json()["text"] for e in first + rest if e.event == "token")
        [turn] = stored_assistant_turns(server.url, server.headers, conv)
        assert turn["content"] == as_stored(text) != ""
        assert serving.stats()["generated_tokens"] == 1000  # all of it written there


@pytest.mark.parametrize("how", ["api", "stop button"])
def test_stop_reaches_the_replica_at_once(data_dir: Path, slow_replica: Replica, how: str) -> None:
    serving = slow_replica
    with front(data_dir, [serving.url]) as server:
        conv = new_conversation(server.url, server.headers)
        body = {"content": "a very long story", "max_tokens": 4000}
        tokens = 0
        with httpx.stream(
            "POST", turn_url(server.url, conv), json=body, headers=server.headers, timeout=60
        ) as resp:
            events = parse_sse(resp.iter_lines())
            for event in events:
                tokens += event.event == "token"
                if tokens == 3:
                    break
            assert serving.stats()["running"] == 1
            if how == "api":
                stop = httpx.post(
                    f"{server.url}/v1/conversations/{conv}/cancel", headers=server.headers
                )
            else:  # what the UI's stop button sends
                stop = httpx.post(
                    server.url + f"/ui/c/{conv}/stop",
                    headers={**server.headers, "HX-Request": "true"},
                )
            assert stop.status_code == 204, stop.text
            stopped_at = time.monotonic()
            rest = list(events)
        assert rest[-1].event == "done" and rest[-1].json()["status"] == "stopped"
        # At the replica: the sequence is gone at once (a generous bound for a loaded 2-core
        # machine; the answer had thousands of tokens to go) and no token follows.
        while (stats := serving.stats())["running"] or stats["streams"]:
            assert time.monotonic() - stopped_at < 2.0, stats
            time.sleep(0.02)
        written = stats["generated_tokens"]
        time.sleep(0.5)
        assert serving.stats()["generated_tokens"] == written < 4000
        [turn] = stored_assistant_turns(server.url, server.headers, conv)
        assert turn["status"] == "stopped"
