"""Long conversations on the tiny model with a small context: the oldest part is summarised
in the background, the next prompt is system prompt + summary + recent turns, the summary
survives a restart and stays on its branch, and without one the UI names what is hidden."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from chatbox.app import create_app
from chatbox.catalog.registry import ModelRegistry
from chatbox.chat.summaries import SUMMARY_HEADING, SUMMARY_PRIORITY
from chatbox.engine.types import Engine, GenerationRequest
from chatbox.settings import Settings
from tests.conftest import bearer, seed_user, test_settings
from tests.sse import parse_sse

SYSTEM = "You are a terse assistant for the Harbour project."
CONTEXT = 512  # tokens per sequence: the tiny model spends about one per character


class Recording:
    """An engine that records every request it is given (turns and summaries alike)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.requests: list[GenerationRequest] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def submit(self, request: GenerationRequest, **kw: Any) -> Any:
        self.requests.append(request)
        return self.engine.submit(request, **kw)


class RecordingModels:
    def __init__(self, models: Any) -> None:
        self.models = models
        self.engines: dict[str, Recording] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.models, name)

    async def engine(self, name: str) -> Recording:
        engine = await self.models.engine(name)
        return self.engines.setdefault(name, Recording(engine))


def small(data_dir: Path, **overrides: Any) -> Settings:
    return test_settings(data_dir, n_ctx_per_seq=CONTEXT, max_tokens=16, **overrides)


@pytest.fixture
def box(data_dir: Path, registry: ModelRegistry) -> Iterator[tuple[TestClient, RecordingModels]]:
    settings = small(data_dir)
    key = seed_user(settings)
    with TestClient(create_app(settings, registry), timeout=60) as client:
        client.headers.update(bearer(key))
        chat = client.app.state.services.chat
        chat.models = models = RecordingModels(chat.models)
        yield client, models


def message(i: int) -> str:
    return (
        f"Message {i}: the crane on pier {i} needs a new cable before the storm, "
        "and the harbour master wants it checked twice."
    )


def send(client: TestClient, conv: str, text: str, path: str = "turns") -> dict[str, Any]:
    response = client.post(f"/v1/conversations/{conv}/{path}", json={"content": text})
    assert response.status_code == 200, response.text
    events = list(parse_sse(iter(response.text.split("\n"))))
    return dict(next(e for e in events if e.event in ("done", "error")).json())


def read(client: TestClient, conv: str) -> dict[str, Any]:
    response = client.get(f"/v1/conversations/{conv}", params={"limit": 500})
    assert response.status_code == 200, response.text
    return dict(response.json())


def settled(client: TestClient, conv: str) -> dict[str, Any]:
    """The conversation once no summary of it is being written."""
    deadline = time.monotonic() + 60
    while (view := read(client, conv))["context"]["summarising"]:
        assert time.monotonic() < deadline, "the summary never finished"
        time.sleep(0.05)
    return view


def talk(client: TestClient, conv: str, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        done = send(client, conv, message(i))
        assert done["status"] == "complete", done
        settled(client, conv)


def new_conversation(client: TestClient) -> str:
    response = client.post("/v1/conversations", json={"system_prompt": SYSTEM})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def test_a_conversation_far_longer_than_the_window_keeps_answering(box: Any) -> None:
    client, models = box
    conv = new_conversation(client)
    talk(client, conv, 16)
    view = read(client, conv)
    said = sum(len(t["content"]) for t in view["turns"])
    assert said > 4 * CONTEXT  # far past the window
    assert all(t["status"] == "complete" for t in view["turns"]), view["turns"]
    assert view["summary"] is not None
    assert view["context"]["used"] <= CONTEXT
    turns = [r for r in models.engines["tiny"].requests if r.priority == 0]
    assert len(turns) == 16 and all(r.cache_key == conv for r in turns)


def test_the_next_prompt_is_the_system_prompt_the_summary_and_the_recent_turns(box: Any) -> None:
    client, models = box
    conv = new_conversation(client)
    talk(client, conv, 6)
    view = settled(client, conv)
    summary = view["summary"]
    assert summary is not None and summary["content"]
    ids = [t["id"] for t in view["turns"]]
    covered = ids.index(summary["covers_turn_id"]) + 1
    assert summary["covered_turns"] == covered
    recent = view["turns"][covered:]

    send(client, conv, "And what about the cable?")
    engine = models.engines["tiny"]
    prompt = [r for r in engine.requests if r.priority == 0][-1].messages
    assert prompt[0].role == "system"
    assert prompt[0].content == f"{SYSTEM}\n\n{SUMMARY_HEADING}\n{summary['content']}"
    sent = [m.content for m in prompt[1:]]
    assert sent[-1] == "And what about the cable?"
    assert len(sent) > 1, prompt  # recent turns, not only the new message
    assert sent[:-1] == [t["content"] for t in recent][-len(sent[:-1]) :]
    assert sent[0] == recent[0]["content"] and recent[0]["role"] == "user"
    assert all(message(0) not in m.content for m in prompt)  # the oldest turn: summarised

    # The summary was written at low priority, in the user's private cache scope, and never
    # took the conversation's cached prefix.
    written = [r for r in engine.requests if r.priority != 0]
    assert written and all(r.priority == SUMMARY_PRIORITY > 0 for r in written)
    scope = turns_scope = {r.cache_scope for r in engine.requests if r.priority == 0}
    assert len(turns_scope) == 1 and None not in scope  # the conversation's owner
    assert all(r.cache_key is None and {r.cache_scope} == scope for r in written)
    assert message(0) in written[0].messages[-1].content


def test_the_summary_survives_a_restart_and_stays_on_its_branch(
    data_dir: Path, registry: ModelRegistry
) -> None:
    settings = small(data_dir)
    key = seed_user(settings)
    with TestClient(create_app(settings, registry), timeout=60) as client:
        client.headers.update(bearer(key))
        conv = new_conversation(client)
        talk(client, conv, 6)
        before = settled(client, conv)
    assert before["summary"] is not None
    with TestClient(create_app(settings, registry), timeout=60) as client:
        client.headers.update(bearer(key))
        after = read(client, conv)
        assert after["summary"] == before["summary"]  # reloaded from the store
        page = client.get(f"/c/{conv}")
        assert page.status_code == 200
        assert "Earlier messages summarised" in page.text
        assert '<details class="summary-turn"' in page.text

        chat = client.app.state.services.chat
        chat.models = models = RecordingModels(chat.models)
        first = before["turns"][0]  # covered by the summary
        done = send(client, conv, "A different start.", f"turns/{first['id']}/edit")
        assert done["status"] == "complete"
        edited = read(client, conv)
        assert edited["summary"] is None  # the other branch's summary does not leak in
        assert edited["turns"][0]["content"] == "A different start."
        prompt = [r for r in models.engines["tiny"].requests if r.priority == 0][-1].messages
        assert all(SUMMARY_HEADING not in m.content for m in prompt)
        assert prompt[0].content == SYSTEM

        back = client.post(f"/v1/conversations/{conv}/branch", json={"turn_id": first["id"]})
        assert back.status_code == 200, back.text
        assert back.json()["summary"] == before["summary"]


def test_without_a_summary_the_ui_says_which_turns_the_model_cannot_see(
    data_dir: Path, registry: ModelRegistry
) -> None:
    settings = small(data_dir, summary_at=0.0)  # summaries off: turns must be dropped
    key = seed_user(settings)
    with TestClient(create_app(settings, registry), timeout=60) as client:
        client.headers.update(bearer(key))
        conv = new_conversation(client)
        talk(client, conv, 6)
        view = read(client, conv)
        assert view["summary"] is None
        hidden = view["context"]["hidden_turn_ids"]
        ids = [t["id"] for t in view["turns"]]
        assert hidden and hidden == ids[: len(hidden)]  # the oldest ones
        assert view["context"]["used"] <= CONTEXT
        page = client.get(f"/c/{conv}")
        n = len(hidden)
        assert f"The model cannot see the {n} messages above this line" in page.text
        # The notice sits right after the last hidden turn.
        assert page.text.index("unseen-notice") > page.text.index(f'id="turn-{hidden[-1]}"')
        assert page.text.index("unseen-notice") < page.text.index(f'id="turn-{ids[n]}"')
