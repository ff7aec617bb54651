"""A streamed chat completion is served as Server-Sent Events, as OpenAI's clients expect."""

from __future__ import annotations

from litestar.testing import TestClient


def test_streamed_completion_is_an_event_stream(client: TestClient) -> None:
    body = {"model": "tiny", "stream": True, "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"


def test_plain_completion_is_json(client: TestClient) -> None:
    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    response = client.post("/v1/chat/completions", json=body)
    assert response.headers["content-type"].startswith("application/json")
