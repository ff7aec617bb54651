"""The assistant's tools through the conversation API of a served box (the tiny model,
scripted with `tool_choice` so its grammar makes it call the named tools in order): each
call and its result are turns of their own, in the conversation's JSON and streamed as SSE
events; the tier's budget bounds the calls; Stop cancels a running tool; zero retention
stores nothing; erasing the conversation takes its tool turns and cached results."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from chatbox.chat.policy import default_policy_path
from tests.conftest import _answers_unchecked, run_sql
from tests.served import Served
from tests.sse import Event, parse_sse

ROOT = Path(__file__).resolve().parents[2]

TIMEOUT = 90.0
SECRET = "otterwisdom"
CALLS = 3  # the test policy's paid tier: tool calls in one answer
DOC = f"Otters hold hands while sleeping. {SECRET}. " * 5
QUESTION = "Look it up in my documents, then compute it."
SEED = 7
# The random tiny model can repeat one character for ever inside a string the grammar leaves
# unbounded (a program's 20,000 characters); a forced call cut by max_tokens is no call.
UNSTUCK = {"seed": SEED, "frequency_penalty": 0.5}


def _policy(where: Path) -> Path:
    text = default_policy_path().read_text()
    text = re.sub(r"(?m)^tool_calls = \d+\b.*$", f"tool_calls = {CALLS}", text)
    assert f"tool_calls = {CALLS}" in text
    where.mkdir(parents=True, exist_ok=True)
    path = where / "tools-policy.toml"
    path.write_text(text)
    return _answers_unchecked(path, where)


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Served]:
    where = tmp_path_factory.mktemp("tools")
    served = Served(
        where,
        model=tiny_gguf,
        policy=_policy(where / "policy"),
        env={
            "CHATBOX_TOOLBOXES": "tests.web.slow_tools:toolbox",
            # The served process imports that toolbox from this checkout.
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
            # Byte-level tokens: the tools' descriptions, passages and programs take ~5,000.
            "CHATBOX_N_CTX": "32768",
            "CHATBOX_N_CTX_PER_SEQ": "8192",
        },
    )
    with served:
        yield served


@pytest.fixture(scope="module")
def ann(box: Served) -> httpx.Client:
    http = httpx.Client(
        base_url=box.url, headers=box.auth(box.user("ann", tier="paid")), timeout=TIMEOUT
    )
    shelved = http.post(
        "/v1/documents",
        files={"file": ("otters.txt", DOC)},
    )
    assert shelved.status_code == 201, shelved.text
    return http


def _send(http: httpx.Client, conv: str, **body: Any) -> list[Event]:
    payload = {"content": QUESTION, **body}
    with http.stream("POST", f"/v1/conversations/{conv}/turns", json=payload) as r:
        assert r.status_code == 200, r.read()
        return list(parse_sse(r.iter_lines()))


def _rows(box: Served, sql: str, *params: object) -> list[tuple[Any, ...]]:
    return run_sql(box.database, sql, params)


@pytest.mark.timeout(600)  # three passes of the tiny model over ~3,000 byte tokens each
def test_library_search_and_code_calls_are_turns_streamed_and_stored(
    box: Served, ann: httpx.Client
) -> None:
    conv = ann.post("/v1/conversations", json={"title": "otters"}).json()["id"]
    events = _send(
        ann, conv, tool_choice=["search_library", "run_python"], max_tokens=1500, **UNSTUCK
    )
    kinds = [e.event for e in events]
    assert kinds[0] == "start" and kinds[-1] == "done", (kinds, events[-1].data)
    calls = [e.json() for e in events if e.event == "tool_call"]
    results = [e.json() for e in events if e.event == "tool_result"]
    assert [c["name"] for c in calls] == ["search_library", "run_python"]
    assert [r["name"] for r in results] == ["search_library", "run_python"]
    assert kinds.index("tool_result") > kinds.index("tool_call")
    search = results[0]
    assert not search["is_error"] and SECRET in search["text"]
    assert search["citations"][0]["title"] == "otters.txt"
    # The random program ran in the sandbox under the server's own event loop: its result is
    # what Python made of it (output, an error, an exit status), not a sandbox that failed.
    assert results[1]["text"] and isinstance(results[1]["is_error"], bool)
    assert "the sandbox could not run it" not in results[1]["text"], results[1]["text"]

    turns = ann.get(f"/v1/conversations/{conv}").json()["turns"]
    roles = [t["role"] for t in turns]
    assert roles == ["user", "tool_call", "tool_result", "tool_call", "tool_result", "assistant"]
    assert [t["id"] for t in turns[1:5]] == [
        calls[0]["turn_id"],
        results[0]["turn_id"],
        calls[1]["turn_id"],
        results[1]["turn_id"],
    ]
    for turn, parent in zip(turns[1:], turns, strict=False):
        assert turn["parent_id"] == parent["id"]  # one chain: the answer follows its tools
    assert turns[1]["tool"]["name"] == "search_library"
    assert "query" in turns[1]["tool"]["arguments"]
    assert turns[2]["tool"]["citations"][0]["document_id"]
    assert turns[-1]["status"] == "complete"
    # The search's result is cached for this conversation (the program's, if it failed, is not).
    cached = _rows(box, "SELECT tool FROM tool_results WHERE conversation_id = ?", conv)
    assert ("search_library",) in cached


def test_the_tiers_budget_bounds_the_calls(ann: httpx.Client) -> None:
    conv = ann.post("/v1/conversations", json={}).json()["id"]
    # The time takes no arguments: each forced call is exactly `{}`.
    events = _send(ann, conv, tool_choice=["current_time"] * (CALLS + 2), max_tokens=300)
    assert [e.event for e in events][-1] == "done"
    assert len([e for e in events if e.event == "tool_call"]) == CALLS
    roles = [t["role"] for t in ann.get(f"/v1/conversations/{conv}").json()["turns"]]
    assert roles.count("tool_call") == roles.count("tool_result") == CALLS
    assert roles[-1] == "assistant"


def test_an_unknown_tool_or_bad_choice_is_a_clear_422(ann: httpx.Client) -> None:
    conv = ann.post("/v1/conversations", json={}).json()["id"]
    for choice in (["no_such_tool"], "sometimes", [""]):
        r = ann.post(
            f"/v1/conversations/{conv}/turns", json={"content": "hi", "tool_choice": choice}
        )
        assert r.status_code == 422, r.text
        assert "tool" in r.text
    assert ann.get(f"/v1/conversations/{conv}").json()["turns"] == []


def test_stop_cancels_a_running_tool(ann: httpx.Client) -> None:
    conv = ann.post("/v1/conversations", json={}).json()["id"]
    payload = {"content": "wait", "tool_choice": ["wait_a_minute"], "max_tokens": 200}
    events: list[Event] = []
    started = time.monotonic()
    with ann.stream("POST", f"/v1/conversations/{conv}/turns", json=payload) as r:
        assert r.status_code == 200
        for event in parse_sse(r.iter_lines()):
            events.append(event)
            if event.event == "tool_call":
                assert ann.post(f"/v1/conversations/{conv}/cancel").status_code == 204
    assert time.monotonic() - started < 50  # the minute-long tool did not run out
    result = next(e.json() for e in events if e.event == "tool_result")
    assert result["is_error"] and result["text"] == "stopped by the user"
    assert events[-1].event == "done" and events[-1].json()["status"] == "stopped"
    turns = ann.get(f"/v1/conversations/{conv}").json()["turns"]
    assert [t["role"] for t in turns] == ["user", "tool_call", "tool_result", "assistant"]
    assert turns[-1]["status"] == "stopped"


def test_zero_retention_stores_no_tool_turn_and_no_cached_result(
    box: Served, ann: httpx.Client
) -> None:
    conv = ann.post("/v1/conversations", json={}).json()["id"]
    before = _rows(box, "SELECT count(*) FROM tool_results")[0][0]
    zdr = {"X-Chatbox-Retention": "none"}
    forced = ann.post(
        f"/v1/conversations/{conv}/turns",
        json={"content": "find otters", "tool_choice": ["search_library"]},
        headers=zdr,
    )
    assert forced.status_code == 422 and "zero-data-retention" in forced.text
    with ann.stream(
        "POST",
        f"/v1/conversations/{conv}/turns",
        json={"content": f"find {SECRET}", "max_tokens": 8},
        headers=zdr,
    ) as r:
        events = list(parse_sse(r.iter_lines()))
    assert events[-1].event == "done"
    assert not [e for e in events if e.event.startswith("tool_")]
    assert ann.get(f"/v1/conversations/{conv}").json()["turns"] == []
    assert _rows(box, "SELECT count(*) FROM tool_results")[0][0] == before


@pytest.mark.timeout(600)  # alone, it starts the box and loads the embedding model
def test_erasing_the_conversation_takes_its_tool_turns_and_cached_results(
    box: Served, ann: httpx.Client
) -> None:
    conv = ann.post("/v1/conversations", json={}).json()["id"]
    events = _send(ann, conv, tool_choice=["search_library"], max_tokens=1500, **UNSTUCK)
    assert any(e.event == "tool_result" for e in events), [(e.event, e.data) for e in events]
    assert _rows(box, "SELECT count(*) FROM tool_results WHERE conversation_id = ?", conv)[0][0]
    assert ann.delete(f"/v1/conversations/{conv}").status_code == 204
    assert _rows(box, "SELECT count(*) FROM turns WHERE conversation_id = ?", conv)[0][0] == 0
    left = _rows(box, "SELECT count(*) FROM tool_results WHERE conversation_id = ?", conv)
    assert left[0][0] == 0


def _prompt_tokens(http: httpx.Client, **body: Any) -> int:
    """The prompt size of a first question's answer (a fresh conversation each time)."""
    conv = http.post("/v1/conversations", json={}).json()["id"]
    payload = {"content": "Hello there", "max_tokens": 4, "tool_choice": "none", **body}
    with http.stream("POST", f"/v1/conversations/{conv}/turns", json=payload) as r:
        events = list(parse_sse(r.iter_lines()))
    assert events[-1].event == "done", events[-1].data
    return int(events[-1].json()["usage"]["prompt_tokens"])


def test_tools_are_offered_only_when_the_turn_asks_for_them(ann: httpx.Client) -> None:
    """The tier allows tools, yet a turn that does not ask for them (`tool_choice` left
    out) is sent without their descriptions, as with "none"; "auto" offers them."""
    conv = ann.post("/v1/conversations", json={}).json()["id"]
    payload = {"content": "Hello there", "max_tokens": 4}
    with ann.stream("POST", f"/v1/conversations/{conv}/turns", json=payload) as r:
        events = list(parse_sse(r.iter_lines()))
    unasked = int(events[-1].json()["usage"]["prompt_tokens"])
    assert unasked == _prompt_tokens(ann, tool_choice="none")
    assert _prompt_tokens(ann, tool_choice="auto") > unasked + 500  # the descriptions
