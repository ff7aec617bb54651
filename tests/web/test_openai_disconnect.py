"""A streaming OpenAI client that disconnects is still charged what it used."""

from __future__ import annotations

import time

import httpx

from tests.conftest import LiveServer


def test_a_disconnected_stream_is_charged_its_real_usage(live: LiveServer) -> None:
    body = {
        "model": "tiny",
        "stream": True,
        "max_tokens": 400,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
    }
    with httpx.Client(base_url=live.url, headers=live.headers, timeout=30) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as stream:
            chunks = []
            for line in stream.iter_lines():
                if line.startswith("data:"):
                    chunks.append(line)
                if len(chunks) >= 3:
                    break
        deadline = time.monotonic() + 10
        completion = 0
        while time.monotonic() < deadline and completion == 0:
            rows = http.get("/v1/admin/usage").json()["data"]
            completion = sum(r["completion_tokens"] for r in rows)
            requests = sum(r["requests"] for r in rows)
            time.sleep(0.1)
    assert requests == 1
    assert completion >= 2  # the tokens it streamed before leaving, not zero
