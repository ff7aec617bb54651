"""The OpenAI API streams one token a chunk (as OpenAI and llama-server do), while the
conversation API keeps joining the tokens that arrive together (its pacing)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.served import Served
from tests.sse import parse_sse

# The tiny model's vocabulary is every byte plus a few merges: banning the bytes that are not
# printable ASCII (and whitespace, which a stream may strip at its start) leaves only tokens
# that are text on their own, so none is held back to be sent with the next.
BANNED = {str(b): -100 for b in (*range(0, 33), *range(127, 256))}
TOKENS = 48


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Served]:
    with Served(tmp_path_factory.mktemp("chunks"), model=tiny_gguf) as served:
        yield served


def test_a_streamed_completion_sends_one_token_per_chunk(box: Served) -> None:
    key = box.user("ann")
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "Count to a hundred, please."}],
        "max_tokens": TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logit_bias": BANNED,
    }
    chunks: list[dict[str, Any]] = []
    with httpx.stream(
        "POST", box.url + "/v1/chat/completions", headers=box.auth(key), json=body, timeout=120
    ) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == TOKENS
    texts = [
        c["choices"][0]["delta"]["content"]
        for c in chunks
        if c["choices"] and c["choices"][0]["delta"].get("content")
    ]
    assert len(texts) == usage["completion_tokens"]  # one token, one chunk


def test_the_conversation_api_still_joins_tokens_that_arrive_together(box: Served) -> None:
    key = box.user("bob")
    conv = httpx.post(box.url + "/v1/conversations", headers=box.auth(key), json={}, timeout=30)
    assert conv.status_code in (200, 201), conv.text
    r = httpx.post(
        f"{box.url}/v1/conversations/{conv.json()['id']}/turns",
        headers=box.auth(key),
        json={"content": "Tell me a long story.", "max_tokens": 96},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    events = list(parse_sse(iter(r.text.split("\n"))))
    tokens = [e for e in events if e.event == "token"]
    done = events[-1].json()
    # The tiny model writes a token in about a millisecond; tokens are handed to the event
    # loop every `stream_interval_s` (0.04 s), so many ride in one event.
    assert done["usage"]["completion_tokens"] > 16
    assert 1 <= len(tokens) < done["usage"]["completion_tokens"]
