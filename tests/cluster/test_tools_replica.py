"""The assistant's tools in router mode: a served front (`chatbox serve --no-local --replica
URL`) whose answers a real `chatbox replica` writes, with the tier's tools offered. The tool
loop runs at the front; each pass's request (tools, grammar, tool messages) crosses the
replica protocol, and a prompt the tools' descriptions would push past the replica's context
is answered without them, as the local engine does, instead of failing at the replica."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from chatbox.chat.policy import default_policy_path
from tests.cluster.conftest import TOKEN, Replica
from tests.conftest import _answers_unchecked
from tests.served import Served
from tests.sse import Event, parse_sse

CALLS = 2
# Byte-level tokens: ~3,000 of the 4,096 the replica lets one conversation hold, which leaves the
# message room on its own but none beside the tools' ~2,000 tokens of descriptions.
LONG = "Otters hold hands while they sleep. " * 85


def _policy(where: Path) -> Path:
    shipped = default_policy_path().read_text()
    text = re.sub(r"(?m)^tool_calls = \d+\b.*$", f"tool_calls = {CALLS}", shipped)
    where.mkdir(parents=True, exist_ok=True)
    path = where / "tools-policy.toml"
    path.write_text(text)
    return _answers_unchecked(path, where)


@pytest.fixture(scope="module")
def front(
    tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path, replica_dir: Path
) -> Iterator[Served]:
    where = tmp_path_factory.mktemp("tools-front")
    replica = Replica(replica_dir)
    try:
        served = Served(
            where,
            model=tiny_gguf,
            policy=_policy(where / "policy"),
            args=("--replica", replica.url, "--no-local"),
            env={"CHATBOX_REPLICA_TOKEN": TOKEN},
        )
        with served:
            yield served
    finally:
        replica.stop()


@pytest.fixture(scope="module")
def ann(front: Served) -> httpx.Client:
    key = front.user("ann", tier="paid")
    return httpx.Client(base_url=front.url, headers=front.auth(key), timeout=120)


def _send(http: httpx.Client, **payload: object) -> tuple[str, list[Event]]:
    conv = http.post("/v1/conversations", json={}).json()["id"]
    with http.stream("POST", f"/v1/conversations/{conv}/turns", json=payload) as r:
        assert r.status_code == 200, r.read()
        return conv, list(parse_sse(r.iter_lines()))


@pytest.mark.timeout(300)
def test_a_tool_call_answered_through_a_replica(ann: httpx.Client) -> None:
    payload = {"content": "What time is it?", "tool_choice": ["current_time"], "max_tokens": 300}
    conv, events = _send(ann, **payload)
    said = [(e.event, e.data) for e in events if e.event != "token"]
    assert events[-1].event == "done" and events[-1].json()["status"] == "complete", said
    assert [e.json()["name"] for e in events if e.event == "tool_call"] == ["current_time"]
    result = next(e.json() for e in events if e.event == "tool_result")
    assert not result["is_error"] and result["text"], result
    roles = [t["role"] for t in ann.get(f"/v1/conversations/{conv}").json()["turns"]]
    assert roles == ["user", "tool_call", "tool_result", "assistant"]


@pytest.mark.timeout(300)
def test_a_message_with_no_room_for_the_tools_is_answered_without_them(
    ann: httpx.Client,
) -> None:
    conv, events = _send(ann, content=LONG, tool_choice="auto", max_tokens=16)
    said = [(e.event, e.data) for e in events if e.event != "token"]
    assert events[-1].event == "done" and events[-1].json()["status"] == "complete", said
    assert not [e for e in events if e.event.startswith("tool_")]
    turns = ann.get(f"/v1/conversations/{conv}").json()["turns"]
    assert [(t["role"], t["status"]) for t in turns] == [
        ("user", "complete"),
        ("assistant", "complete"),
    ]


def test_a_forced_tool_with_no_room_is_a_clear_413_and_nothing_is_stored(
    ann: httpx.Client,
) -> None:
    conv = ann.post("/v1/conversations", json={}).json()["id"]
    payload = {"content": LONG, "tool_choice": ["current_time"], "max_tokens": 16}
    r = ann.post(f"/v1/conversations/{conv}/turns", json=payload)
    assert r.status_code == 413, r.text
    assert "tokens" in r.text and "context window" in r.text
    assert ann.get(f"/v1/conversations/{conv}").json()["turns"] == []
