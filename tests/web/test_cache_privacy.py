"""The prefix cache is private: one user's text never shortens another user's prefill."""

from __future__ import annotations

from typing import Any

from litestar.testing import TestClient

from chatbox.app import create_app
from chatbox.catalog.registry import ModelRegistry
from chatbox.settings import Settings
from tests.conftest import bearer, seed_user
from tests.sse import parse_sse


def cached(client: TestClient, key: str, text: str) -> int:
    response = client.post(
        "/v1/chat/completions",
        headers=bearer(key),
        json={
            "model": "tiny",
            "max_tokens": 1,
            "temperature": 0,
            "messages": [{"role": "user", "content": text}],
        },
    )
    assert response.status_code == 200, response.text
    return int(response.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def test_another_users_secret_is_not_an_oracle(settings: Settings, registry: ModelRegistry) -> None:
    admin = seed_user(settings)
    member = seed_user(settings, "mallory", role="member", tier="paid")
    with TestClient(create_app(settings, registry), timeout=60) as client:
        cached(client, admin, "My locker code is 4721")
        seen = {g: cached(client, member, f"My locker code is 4{g}") for g in range(10)}
    # After the member's first probe, each reuses the member's own "My locker code is 4";
    # the digit that matches the admin's secret must not reuse one token more.
    later = {g: n for g, n in seen.items() if g != 0}
    assert len(set(later.values())) == 1, seen


def send(client: TestClient, key: str, conv: str, text: str) -> dict[str, Any]:
    with client.stream(
        "POST", f"/v1/conversations/{conv}/turns", headers=bearer(key), json={"content": text}
    ) as response:
        events = list(parse_sse(response.iter_lines()))
    return dict(next(e for e in events if e.event == "done").json()["usage"])


def test_one_user_reuses_their_own_text_across_conversations(
    settings: Settings, registry: ModelRegistry
) -> None:
    alice = seed_user(settings, "alice", role="member", tier="paid")
    bob = seed_user(settings, "bob", role="member", tier="paid")
    prompt = "You are a pirate who answers in riddles about the sea and its ships. " * 3
    with TestClient(create_app(settings, registry), timeout=60) as client:

        def conv(key: str) -> str:
            response = client.post(
                "/v1/conversations", headers=bearer(key), json={"system_prompt": prompt}
            )
            return str(response.json()["id"])

        first = send(client, alice, conv(alice), "hello")
        again = send(client, alice, conv(alice), "ahoy")
        other = send(client, bob, conv(bob), "hello")
    assert again["cached_tokens"] > first["cached_tokens"] + 20  # her system prompt, reused
    assert other["cached_tokens"] < again["cached_tokens"] - 20  # never for someone else
