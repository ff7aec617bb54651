"""Search on `chatbox serve` right after an answer: the turns just written are found at once
(by their words, while they are embedded behind the search) and by meaning once indexed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.served import Served


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Served]:
    served = Served(
        tmp_path_factory.mktemp("search"), model=tiny_gguf, env={"CHATBOX_MAX_TOKENS": "16"}
    )
    served.start()
    try:
        yield served
    finally:
        served.kill()


def search(box: Served, key: str, q: str, mode: str) -> list[dict[str, Any]]:
    r = httpx.get(
        f"{box.url}/v1/search",
        params={"q": q, "mode": mode},
        headers=box.auth(key),
        timeout=120,
    )
    assert r.status_code == 200, r.text
    hits: list[dict[str, Any]] = r.json()["data"]
    return hits


def test_a_new_turn_is_found_right_after_its_answer_and_by_meaning_once_indexed(
    box: Served,
) -> None:
    ann = box.user("ann")
    conv = httpx.post(
        f"{box.url}/v1/conversations", headers=box.auth(ann), json={}, timeout=60
    ).json()["id"]
    with httpx.stream(
        "POST",
        f"{box.url}/v1/conversations/{conv}/turns",
        headers=box.auth(ann),
        json={"content": "How do zebras graze on the savanna in Kenya?"},
        timeout=120,
    ) as r:
        assert r.status_code == 200
        r.read()
    for mode in ("both", "meaning"):
        hits = search(box, ann, "zebras grazing", mode)
        assert any(h["conversation_id"] == conv and h["role"] == "user" for h in hits), mode
    deadline = time.monotonic() + 60
    while True:  # indexed behind the search: then found by meaning alone
        hits = search(box, ann, "striped animals eating grass in Africa", "meaning")
        if any(h["conversation_id"] == conv and h["match"] == "meaning" for h in hits):
            break
        assert time.monotonic() < deadline, hits
        time.sleep(0.5)
