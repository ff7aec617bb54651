"""Approval before side effects: a conversation's call of an MCP tool that is not marked
read-only waits for the person the answer is for (the stream's `tool_approval` event) and
runs only once allowed; a denial, or no decision within the turn's tool time, gives the model
a denial; no one else can decide (404); each decision is in the audit log; a read-only tool
runs without asking. The tiny model is made to call the tool with `tool_choice`."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.served import Served
from tests.sse import Event, parse_sse
from tests.web.test_tools_served import _policy

COMMAND = f"{sys.executable} {Path(__file__).parent.parent / 'chat' / 'mcp_server.py'}"
FREE_TOOL_SECONDS = 12  # the free tier's tool time: an undecided call is denied after it
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Served]:
    where = tmp_path_factory.mktemp("approval")
    policy = _policy(where / "policy")
    text = policy.read_text()
    text = re.sub(r"(?m)^tool_seconds = 30\b", f"tool_seconds = {FREE_TOOL_SECONDS}", text, count=1)
    assert f"tool_seconds = {FREE_TOOL_SECONDS}" in text
    policy.write_text(text)
    env = {"CHATBOX_N_CTX": "32768", "CHATBOX_N_CTX_PER_SEQ": "8192"}
    with Served(where, model=tiny_gguf, policy=policy, env=env) as served:
        served.cli("tools", "add", "calc", "--command", COMMAND)
        served.cli("tools", "mark", "calc", "pid", "--read-only")
        yield served


@pytest.fixture(scope="module")
def people(box: Served) -> dict[str, httpx.Client]:
    return {
        name: httpx.Client(
            base_url=box.url, headers=box.auth(box.user(name, tier=tier)), timeout=300
        )
        for name, tier in (("ann", "paid"), ("bob", "paid"), ("fay", "free"))
    }


def ask(http: httpx.Client, tool: str, on_approval: object = None) -> tuple[str, list[Event]]:
    """A new chat whose answer must call `tool`: its id and the stream's events;
    `on_approval(conv, event)` runs when the stream says a call waits."""
    conv = http.post("/v1/conversations", json={"title": "approval"}).json()["id"]
    body = {"content": "Add 2 and 3.", "tool_choice": [tool], "max_tokens": 600}
    events = []
    with http.stream("POST", f"/v1/conversations/{conv}/turns", json=body) as r:
        assert r.status_code == 200, r.read()
        for event in parse_sse(r.iter_lines()):
            events.append(event)
            if event.event == "tool_approval" and on_approval is not None:
                on_approval(conv, event)  # type: ignore[operator]
    assert events[-1].event == "done", events[-1]
    return conv, events


def kinds(events: list[Event]) -> list[str]:
    return [e.event for e in events if e.event.startswith("tool_")]


def result(events: list[Event]) -> dict[str, object]:
    [found] = [json.loads(e.data) for e in events if e.event == "tool_result"]
    return found  # type: ignore[no-any-return]


def approval_url(conv: str, event: Event) -> str:
    return f"/v1/conversations/{conv}/tool-calls/{json.loads(event.data)['id']}/approval"


def test_a_call_waits_and_runs_only_after_allow_and_no_one_else_can_decide(
    box: Served, people: dict[str, httpx.Client]
) -> None:
    seen: dict[str, object] = {}

    def decide(conv: str, event: Event) -> None:
        waiting = json.loads(event.data)
        seen["waiting"] = waiting
        url = approval_url(conv, event)
        seen["bob"] = people["bob"].post(url, json={"allow": True}).status_code
        seen["ann"] = people["ann"].post(url, json={"allow": True}).status_code
        seen["again"] = people["ann"].post(url, json={"allow": True}).status_code

    conv, events = ask(people["ann"], "calc__add", decide)
    assert kinds(events) == ["tool_call", "tool_approval", "tool_decision", "tool_result"]
    assert seen["waiting"]["name"] == "calc__add"  # type: ignore[index]
    arguments = seen["waiting"]["arguments"]  # type: ignore[index]
    assert (seen["bob"], seen["ann"], seen["again"]) == (404, 204, 404)
    done = result(events)
    assert done["is_error"] is False
    assert done["text"] == str(int(arguments["a"]) + int(arguments["b"]))
    audit = box.cli("audit", "list", "--action", "tool.approval", "--json")
    entries = [e for e in json.loads(audit) if e["detail"].get("conversation_id") == conv]
    assert [e["detail"]["decision"] for e in entries] == ["allowed"]
    assert entries[0]["actor"]["name"] == "ann" and entries[0]["detail"]["tool"] == "calc__add"
    calls = json.loads(box.cli("audit", "list", "--action", "mcp.call", "--json"))
    assert any(e["detail"].get("conversation_id") == conv for e in calls)


def test_deny_gives_the_model_a_denial_and_the_tool_never_runs(
    box: Served, people: dict[str, httpx.Client]
) -> None:
    def deny(conv: str, event: Event) -> None:
        assert (
            people["ann"].post(approval_url(conv, event), json={"allow": False}).status_code == 204
        )

    conv, events = ask(people["ann"], "calc__add", deny)
    done = result(events)
    assert done["is_error"] is True and "denied by the user" in str(done["text"])
    calls = json.loads(box.cli("audit", "list", "--action", "mcp.call", "--json"))
    assert not any(e["detail"].get("conversation_id") == conv for e in calls)
    audit = json.loads(box.cli("audit", "list", "--action", "tool.approval", "--json"))
    assert [
        e["detail"]["decision"] for e in audit if e["detail"].get("conversation_id") == conv
    ] == ["denied"]


def test_a_call_not_decided_within_the_tool_time_counts_as_denied(
    box: Served, people: dict[str, httpx.Client]
) -> None:
    conv, events = ask(people["fay"], "calc__add")
    decision = [json.loads(e.data) for e in events if e.event == "tool_decision"]
    assert [d["decision"] for d in decision] == ["expired"]
    assert result(events)["is_error"] is True
    audit = json.loads(box.cli("audit", "list", "--action", "tool.approval", "--json"))
    assert [
        e["detail"]["decision"] for e in audit if e["detail"].get("conversation_id") == conv
    ] == ["expired"]


def test_a_read_only_tool_runs_without_asking(box: Served, people: dict[str, httpx.Client]) -> None:
    _, events = ask(people["ann"], "calc__pid")
    assert kinds(events) == ["tool_call", "tool_result"]
    assert result(events)["is_error"] is False
