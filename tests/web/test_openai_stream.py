"""A streamed chat completion is served as Server-Sent Events, as OpenAI's clients expect."""

from __future__ import annotations

import json

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


def _chunks(client: TestClient, body: dict[str, object]) -> list[dict[str, object]]:
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_every_streamed_chunk_carries_the_system_fingerprint(client: TestClient) -> None:
    body = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
            "stream_options": {"include_usage": True}}  # fmt: skip
    whole = client.post("/v1/chat/completions", json=body).json()["system_fingerprint"]
    chunks = _chunks(client, body)
    assert len(chunks) >= 3  # role, a token or more (the tiny model may stop), finish
    assert {c.get("system_fingerprint") for c in chunks} == {whole}


def test_a_tool_call_stream_opens_without_empty_content(client: TestClient) -> None:
    params = {"type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"]}
    tool = {"type": "function", "function": {"name": "f", "parameters": params}}
    body = {
        "model": "tiny",
        "max_tokens": 80,
        "tools": [tool],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "messages": [{"role": "user", "content": "hi"}],
    }
    chunks = _chunks(client, body)
    first = chunks[0]["choices"][0]["delta"]  # type: ignore[index]
    assert first["role"] == "assistant" and first.get("content") is None
    calls = [c for ch in chunks for c in ch["choices"][0]["delta"].get("tool_calls", [])]  # type: ignore[index]
    assert calls and all(not c["function"]["arguments"].startswith(" ") for c in calls[1:2])
