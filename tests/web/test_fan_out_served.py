"""One request's answers at once (n, several prompts) count toward the tier's max_streams, so
one request cannot take every slot of the engine (`chatbox serve` as shipped, paid tier: 4)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.served import Served


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Served]:
    with Served(tmp_path_factory.mktemp("fanout"), model=tiny_gguf) as served:
        yield served


def refused_for_streams(r: httpx.Response, answers: int) -> None:
    assert r.status_code == 429, r.text
    error = r.json()["error"]
    assert (error["type"], error["code"], error["limit"]) == (
        "rate_limit_error",
        "rate_limit_exceeded",
        "streams",
    )
    assert "max_streams is 4" in error["message"] and f"{answers} answers" in error["message"]
    assert "retry-after" in r.headers


def test_prompts_times_n_over_max_streams_is_refused(box: Served) -> None:
    key = box.user("pam", tier="paid")  # the paid tier: max_streams 4
    prompts = ["Once upon a time", "The sea", "A list:", "Dear Sir,"]
    body = {"prompt": prompts, "n": 8, "max_tokens": 48}
    r = httpx.post(box.url + "/v1/completions", json=body, headers=box.auth(key), timeout=120)
    refused_for_streams(r, 32)
    assert "4 prompts × n=8" in r.json()["error"]["message"]

    chat = {"messages": [{"role": "user", "content": "hi"}], "n": 8, "max_tokens": 4}
    r = httpx.post(box.url + "/v1/chat/completions", json=chat, headers=box.auth(key), timeout=120)
    refused_for_streams(r, 8)
    r = httpx.post(
        box.url + "/v1/chat/completions",
        json={**chat, "stream": True},
        headers=box.auth(key),
        timeout=120,
    )
    refused_for_streams(r, 8)

    # Within the limit, every answer comes back.
    r = httpx.post(
        box.url + "/v1/completions",
        json={"prompt": prompts[:2], "n": 2, "max_tokens": 4},
        headers=box.auth(key),
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert sorted(c["index"] for c in r.json()["choices"]) == [0, 1, 2, 3]
    r = httpx.post(
        box.url + "/v1/chat/completions", json={**chat, "n": 4}, headers=box.auth(key), timeout=120
    )
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 4
