"""The conversation API on the tiny model: create, stream a turn, read, branch, errors."""

from __future__ import annotations

import time
from typing import Any

import pytest
from litestar.testing import TestClient

from tests.conftest import as_stored
from tests.sse import Event, parse_sse


def new_conversation(client: TestClient, **body: Any) -> str:
    response = client.post("/v1/conversations", json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def send(client: TestClient, conv_id: str, content: str, **extra: Any) -> list[Event]:
    response = client.post(f"/v1/conversations/{conv_id}/turns", json={"content": content, **extra})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return list(parse_sse(iter(response.text.split("\n"))))


def turns(client: TestClient, conv_id: str, **params: Any) -> dict[str, Any]:
    response = client.get(f"/v1/conversations/{conv_id}", params=params)
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_a_turn_streams_tokens_then_done_and_is_stored(client: TestClient) -> None:
    conv_id = new_conversation(client)
    response = client.post(f"/v1/conversations/{conv_id}/turns", json={"content": "Hi there!"})
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["x-accel-buffering"] == "no"
    events = list(parse_sse(iter(response.text.split("\n"))))
    kinds = [e.event for e in events]
    assert kinds[0] == "start" and kinds[-1] == "done"
    assert kinds.count("token") >= 1
    assert [int(e.id or 0) for e in events] == list(range(1, len(events) + 1))
    done = events[-1].json()
    streamed = "".join(e.json()["text"] for e in events if e.event == "token")
    assert done["usage"]["completion_tokens"] >= 1
    assert done["usage"]["prompt_tokens"] > 0
    assert set(done["usage"]) == {"prompt_tokens", "completion_tokens", "cached_tokens"}

    view = turns(client, conv_id)
    assert view["title"] == "Hi there!"
    assert [t["role"] for t in view["turns"]] == ["user", "assistant"]
    answer = view["turns"][1]
    assert answer["id"] == done["turn_id"]
    assert answer["content"] == as_stored(streamed)
    assert answer["status"] == "complete"
    assert answer["parent_id"] == view["turns"][0]["id"]
    assert view["context"]["limit"] == 1024
    assert view["context"]["used"] > 0


def test_list_is_newest_first_and_delete_hides(client: TestClient) -> None:
    first = new_conversation(client, title="first")
    second = new_conversation(client, title="second")
    ids = [c["id"] for c in client.get("/v1/conversations").json()["data"]]
    assert ids[:2] == [second, first]
    assert client.delete(f"/v1/conversations/{first}").status_code == 204
    ids = [c["id"] for c in client.get("/v1/conversations").json()["data"]]
    assert first not in ids
    assert client.get(f"/v1/conversations/{first}").status_code == 404


def test_rename_and_system_prompt(client: TestClient) -> None:
    conv_id = new_conversation(client)
    response = client.patch(
        f"/v1/conversations/{conv_id}", json={"title": "Renamed", "system_prompt": "Be brief."}
    )
    assert response.status_code == 200
    view = turns(client, conv_id)
    assert view["title"] == "Renamed" and view["system_prompt"] == "Be brief."


def test_empty_message_is_422_and_stores_nothing(client: TestClient) -> None:
    conv_id = new_conversation(client)
    response = client.post(f"/v1/conversations/{conv_id}/turns", json={"content": "   "})
    assert response.status_code == 422
    assert "empty" in response.json()["error"]["message"]
    assert turns(client, conv_id)["turns"] == []


def test_penalties_are_taken_within_their_range_and_refused_outside_it(
    client: TestClient,
) -> None:
    conv_id = new_conversation(client)
    for name in ("frequency_penalty", "presence_penalty"):
        body = {"content": "Hello", name: 2.5}
        response = client.post(f"/v1/conversations/{conv_id}/turns", json=body)
        assert response.status_code in (400, 422), response.text
        assert name in response.json()["error"]["message"]
    assert turns(client, conv_id)["turns"] == []
    events = send(client, conv_id, "Hello", frequency_penalty=1.0, presence_penalty=-0.5)
    assert events[-1].event == "done" and events[-1].json()["status"] == "complete"


def test_too_long_message_is_413_naming_the_limit(client: TestClient) -> None:
    conv_id = new_conversation(client)
    response = client.post(f"/v1/conversations/{conv_id}/turns", json={"content": "word " * 3000})
    assert response.status_code == 413
    body = response.json()["error"]
    assert str(body["limit"]) in body["message"]
    assert turns(client, conv_id)["turns"] == []


def test_unknown_ids_are_404(client: TestClient) -> None:
    assert client.get("/v1/conversations/c_nope").status_code == 404
    response = client.post("/v1/conversations/c_nope/turns", json={"content": "hi"})
    assert response.status_code == 404
    conv_id = new_conversation(client)
    assert client.post(f"/v1/conversations/{conv_id}/turns/t_nope/regenerate").status_code == 404
    assert (
        client.post(f"/v1/conversations/{conv_id}/branch", json={"turn_id": "t_nope"}).status_code
        == 404
    )


def test_malformed_json_is_400(client: TestClient) -> None:
    conv_id = new_conversation(client)
    response = client.post(
        f"/v1/conversations/{conv_id}/turns",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400
    assert turns(client, conv_id)["turns"] == []


def test_unknown_model_is_404_listing_models(client: TestClient) -> None:
    conv_id = new_conversation(client)
    response = client.post(
        f"/v1/conversations/{conv_id}/turns", json={"content": "hi", "model": "gpt-9"}
    )
    assert response.status_code == 404
    error = response.json()["error"]
    assert "tiny" in error["available"] and "tiny" in error["message"]
    assert turns(client, conv_id)["turns"] == []


def test_regenerate_and_edit_make_branches(client: TestClient) -> None:
    conv_id = new_conversation(client)
    send(client, conv_id, "first question")
    view = turns(client, conv_id)
    user_turn, old_answer = view["turns"]

    regen = client.post(
        f"/v1/conversations/{conv_id}/turns/{old_answer['id']}/regenerate", json={"seed": 7}
    )
    assert regen.status_code == 200
    view = turns(client, conv_id)
    new_answer = view["turns"][1]
    assert new_answer["id"] != old_answer["id"]
    assert new_answer["siblings"] == [old_answer["id"], new_answer["id"]]
    assert new_answer["sibling_index"] == 1

    edit = client.post(
        f"/v1/conversations/{conv_id}/turns/{user_turn['id']}/edit",
        json={"content": "second version"},
    )
    assert edit.status_code == 200
    view = turns(client, conv_id)
    assert view["turns"][0]["content"] == "second version"
    assert view["turns"][0]["siblings"] == [user_turn["id"], view["turns"][0]["id"]]

    # Switch back to the first branch: the original question and its newest answer.
    response = client.post(f"/v1/conversations/{conv_id}/branch", json={"turn_id": user_turn["id"]})
    assert response.status_code == 200
    view = turns(client, conv_id)
    assert [t["id"] for t in view["turns"]] == [user_turn["id"], new_answer["id"]]


def test_pagination_walks_back_with_a_cursor(client: TestClient) -> None:
    conv_id = new_conversation(client)
    for i in range(3):
        send(client, conv_id, f"message {i}", max_tokens=2)
    page = turns(client, conv_id, limit=2)
    assert page["turns"][0]["content"] == "message 2"
    older = turns(client, conv_id, limit=2, before=page["next_cursor"])
    assert older["turns"][0]["content"] == "message 1"
    oldest = turns(client, conv_id, limit=2, before=older["next_cursor"])
    assert oldest["turns"][0]["content"] == "message 0"
    assert oldest["next_cursor"] is None
    seen = [t["id"] for p in (oldest, older, page) for t in p["turns"]]
    assert len(seen) == len(set(seen)) == 6


def test_health_and_readiness(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    deadline = time.monotonic() + 300  # the default models and moderation load in the background
    while (ready := client.get("/readyz")).status_code != 200 and time.monotonic() < deadline:
        # loaded already, it is not ready until start-up work has ended
        assert (
            ready.json()["models"]["tiny"] in ("loading", "not loaded")
            or not (ready.json()["warmed_up"])
        )
        time.sleep(0.05)
    assert ready.status_code == 200
    body = ready.json()
    assert body["model_loaded"] and body["warmed_up"] and body["database_writable"]
    assert ready.json()["models"] == {"tiny": "loaded"}


def test_openapi_schema_lists_the_api(client: TestClient) -> None:
    schema = client.get("/schema/openapi.json").json()
    assert "/v1/conversations/{conv_id}/turns" in schema["paths"]
    assert "/v1/chat/completions" in schema["paths"]


def test_replaying_a_finished_answer_ends(client: TestClient) -> None:
    conv_id = new_conversation(client)
    events = send(client, conv_id, "hello")
    turn_id = events[0].json()["turn_id"]
    replay = client.get(
        f"/v1/conversations/{conv_id}/turns/{turn_id}/events", headers={"Last-Event-ID": "1"}
    )
    replayed = list(parse_sse(iter(replay.text.split("\n"))))
    assert [e.id for e in replayed] == [e.id for e in events[1:]]
    late = client.get(
        f"/v1/conversations/{conv_id}/turns/{turn_id}/events",
        headers={"Last-Event-ID": events[-1].id or ""},
    )
    assert late.status_code == 200 and list(parse_sse(iter(late.text.split("\n")))) == []


@pytest.mark.timeout(60)
def test_an_answer_that_cannot_be_stored_ends_its_stream_with_an_error(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Storing the answer fails (a full disk, a lost database): the client is told so and
    its stream ends, rather than waiting on heartbeats for an answer that never comes."""
    turns_store = client.app.state.services.store.turns

    async def disk_full(*_args: object, **_kwargs: object) -> None:
        raise OSError("database or disk is full")

    monkeypatch.setattr(turns_store, "finish_draft", disk_full)
    conv_id = new_conversation(client)
    events = send(client, conv_id, "hello")
    assert events[-1].event == "error"
    assert events[-1].json()["message"] == "the answer could not be stored"
    monkeypatch.undo()
    assert turns(client, conv_id)["turns"][0]["role"] == "user"  # the question kept
