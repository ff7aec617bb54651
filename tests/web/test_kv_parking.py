"""Parked KV through the app: OpenAI-API follow-ups and conversations after a restart reuse
their history; deleting a conversation deletes its parked file."""

from __future__ import annotations

import time
from typing import Any

from litestar.testing import TestClient

from chatbox.app import create_app
from chatbox.catalog.registry import ModelRegistry
from chatbox.engine.kv.disk import SUFFIX, key_name
from chatbox.settings import Settings
from tests.conftest import bearer, seed_user
from tests.sse import parse_sse

DOC = "The lighthouse keeper wrote in his log every night about the storms and ships. " * 5


def parked_settings(settings: Settings) -> Settings:
    # Every finished conversation leaves the KV cache at once: each follow-up needs parking.
    return settings.with_overrides(idle_kv_cells=0)


def complete(client: TestClient, key: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    body = {"model": "tiny", "max_tokens": 4, "temperature": 0, "messages": messages}
    response = client.post("/v1/chat/completions", headers=bearer(key), json=body)
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_openai_follow_up_restores_the_parked_prefix(
    settings: Settings, registry: ModelRegistry
) -> None:
    settings = parked_settings(settings)
    key = seed_user(settings)
    with TestClient(create_app(settings, registry), timeout=60) as client:
        first = [{"role": "user", "content": DOC}]
        r1 = complete(client, key, first)
        answer = r1["choices"][0]["message"]["content"]
        wait_for(lambda: parked_files(settings))  # the answer's KV has left for the disk tier
        follow = [
            *first,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "Go on"},
        ]
        r2 = complete(client, key, follow)
    cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= r1["usage"]["prompt_tokens"] - 1


def send(client: TestClient, key: str, conv: str, text: str) -> dict[str, Any]:
    with client.stream(
        "POST", f"/v1/conversations/{conv}/turns", headers=bearer(key), json={"content": text}
    ) as response:
        events = list(parse_sse(response.iter_lines()))
    return dict(next(e for e in events if e.event == "done").json()["usage"])


def parked_files(settings: Settings) -> list[str]:
    return [p.name for p in (settings.data_dir / "kv").rglob("*" + SUFFIX)]


def wait_for(cond: Any, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond() and time.monotonic() < end:
        time.sleep(0.02)
    assert cond()


def test_conversation_is_warm_after_a_restart_and_deleted_with_it(
    settings: Settings, registry: ModelRegistry
) -> None:
    key = seed_user(settings)
    with TestClient(create_app(settings, registry), timeout=60) as client:
        conv = client.post("/v1/conversations", headers=bearer(key), json={}).json()["id"]
        first = send(client, key, conv, DOC)
    # stopped: the idle conversation was parked on disk
    assert key_name(conv) in parked_files(settings)
    with TestClient(create_app(settings, registry), timeout=60) as client:
        second = send(client, key, conv, "Go on")
        assert second["cached_tokens"] >= first["prompt_tokens"] - 1
        assert client.delete(f"/v1/conversations/{conv}", headers=bearer(key)).status_code == 204
        assert key_name(conv) not in parked_files(settings)


def test_deleting_a_conversation_deletes_its_parked_kv(
    settings: Settings, registry: ModelRegistry
) -> None:
    settings = parked_settings(settings)
    key = seed_user(settings)
    with TestClient(create_app(settings, registry), timeout=60) as client:
        conv = client.post("/v1/conversations", headers=bearer(key), json={}).json()["id"]
        send(client, key, conv, DOC)
        wait_for(lambda: key_name(conv) in parked_files(settings))  # written in the background
        assert client.delete(f"/v1/conversations/{conv}", headers=bearer(key)).status_code == 204
        assert key_name(conv) not in parked_files(settings)
