"""Fixtures of the security suite: the app with an admin, a victim (bob) and an attacker
(mallory), each with an API key, and helpers shared by the checks."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from litestar.testing import TestClient

from chatbox.app import create_app
from chatbox.catalog.registry import ModelRegistry
from chatbox.knowledge.embedder import Embedder
from chatbox.settings import Settings
from tests.conftest import bearer, seed_user
from tests.sse import Event, parse_sse


@pytest.fixture(scope="session")
def embedder() -> Iterator[Embedder]:
    """Load all-MiniLM-L6-v2 once per session (the app's embedders share the loaded model)."""
    emb = Embedder()
    asyncio.run(emb.load())
    yield emb
    emb.close()


def roomy(settings: Settings) -> Settings:
    """Room for retrieved passages on the tiny model's byte-level vocabulary."""
    return settings.with_overrides(n_ctx_per_seq=4096, n_ctx=8192, knowledge_tokens=3000)


@dataclass
class Cast:
    client: TestClient
    admin: dict[str, str]
    bob: dict[str, str]  # the victim: a paid member
    mallory: dict[str, str]  # the attacker: a free member
    settings: Settings


@pytest.fixture
def cast(settings: Settings, registry: ModelRegistry, embedder: Embedder) -> Iterator[Cast]:
    settings = roomy(settings)
    admin = bearer(seed_user(settings))
    bob = bearer(seed_user(settings, "bob", role="member", tier="paid"))
    mallory = bearer(seed_user(settings, "mallory", role="member", tier="free"))
    with TestClient(create_app(settings, registry), timeout=120) as client:
        yield Cast(client, admin, bob, mallory, settings)


def events(response: Any) -> list[Event]:
    assert response.status_code == 200, response.text
    return list(parse_sse(iter(response.text.split("\n"))))


def send_turn(
    client: TestClient, headers: dict[str, str], conv_id: str, content: str, **extra: Any
) -> tuple[str, str, list[Event]]:
    """Send a message and read the answer to its end: (user turn id, answer id, events)."""
    got = events(
        client.post(
            f"/v1/conversations/{conv_id}/turns",
            headers=headers,
            json={"content": content, "max_tokens": 4, **extra},
        )
    )
    assert got and got[-1].event == "done", [(e.event, e.data[:200]) for e in got]
    answer = got[-1].json()["turn_id"]
    view = client.get(f"/v1/conversations/{conv_id}", headers=headers).json()
    ids = [t["id"] for t in view["turns"]]
    return ids[ids.index(answer) - 1], answer, got


MANUAL = (
    "Zephyr-9 pump manual.\n\nThe Zephyr-9 pump must be descaled every 90 days using citric "
    "acid. Never use vinegar, which damages the seals.\n\nThe warranty lasts five years if the "
    "pump is registered within 30 days of purchase.\n\n" + "Unrelated filler text. " * 120
)
QUESTION = "How often should I descale the Zephyr-9 pump?"
