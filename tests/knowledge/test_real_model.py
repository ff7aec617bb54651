"""Memory extraction and retrieval end to end on the real default model (SmolLM2-135M) and
the real embedding model."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from chatbox.app import create_app
from chatbox.engine.types import Generation, GenerationRequest
from chatbox.knowledge import Knowledge
from chatbox.knowledge.embedder import Embedder
from chatbox.knowledge.extraction import EXTRACTION_PRIORITY
from tests.conftest import bearer, on_smollm2, seed_user
from tests.sse import Event, parse_sse

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def real(
    tmp_path_factory: pytest.TempPathFactory, embedder: Embedder
) -> Iterator[tuple[TestClient, dict[str, str], dict[str, str]]]:
    data_dir: Path = tmp_path_factory.mktemp("knowledge-real") / "data"
    settings, registry = on_smollm2(data_dir, max_tokens=24, memory_idle_s=0.2)
    admin = bearer(seed_user(settings))
    bob = bearer(seed_user(settings, "bob", role="member", tier="paid"))
    with TestClient(create_app(settings, registry), timeout=300) as client:
        yield client, admin, bob


def _turn(client: TestClient, headers: dict[str, str], conv_id: str, text: str) -> list[Event]:
    r = client.post(f"/v1/conversations/{conv_id}/turns", json={"content": text}, headers=headers)
    assert r.status_code == 200, r.text
    return list(parse_sse(iter(r.text.split("\n"))))


def _wait_for_facts(
    client: TestClient, headers: dict[str, str], *words: str
) -> list[dict[str, Any]]:
    """The user's facts once all the words appear (facts are stored one by one)."""
    deadline = time.monotonic() + 240
    facts: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        facts = client.get("/v1/users/me/memory", headers=headers).json()["data"]
        texts = " | ".join(f["text"].lower() for f in facts)
        if facts and all(w in texts for w in words):
            return list(facts)
        time.sleep(0.5)
    raise AssertionError(f"facts with {words} were not extracted: {facts}")


def test_extraction_after_idle_then_retrieval(real) -> None:  # type: ignore[no-untyped-def]
    client, admin, bob = real
    knowledge: Knowledge = client.app.state.services.knowledge
    seen: list[GenerationRequest] = []
    engine_source = knowledge.extractor.engine

    async def spying_engine():  # type: ignore[no-untyped-def]
        engine = await engine_source()

        class Spy:
            info = engine.info

            def submit(self, request: GenerationRequest) -> Generation:
                seen.append(request)
                return engine.submit(request)

        return Spy()

    knowledge.extractor.engine = spying_engine
    conv = client.post("/v1/conversations", json={}, headers=admin).json()
    _turn(
        client,
        admin,
        conv["id"],
        "I prefer metric units. I work on the billing service. Suggest a name for a cat.",
    )
    facts = _wait_for_facts(client, admin, "metric", "billing")
    assert all(f["source"] == "extracted" for f in facts)
    # The model was asked, at background priority, without touching any cached prefix.
    assert seen and all(r.priority == EXTRACTION_PRIORITY > 0 and r.cache_key is None for r in seen)

    # A new conversation: the relevant fact is retrieved into the prompt.
    later = client.post("/v1/conversations", json={}, headers=admin).json()
    events = _turn(client, admin, later["id"], "Which units should you use in answers to me?")
    used = next(e for e in events if e.event == "citations").json()["memories"]
    metric = next(f["id"] for f in facts if "metric" in f["text"].lower())
    assert metric in used

    # Bob never gets the admin's memories in his prompt.
    his = client.post("/v1/conversations", json={}, headers=bob).json()
    events = _turn(client, bob, his["id"], "Which units should you use in answers to me?")
    assert "citations" not in [e.event for e in events]

    # With memory switched off, nothing is retrieved.
    client.patch("/v1/users/me/memory", json={"enabled": False}, headers=admin)
    events = _turn(client, admin, later["id"], "Which units do I prefer?")
    assert "citations" not in [e.event for e in events]
    client.patch("/v1/users/me/memory", json={"enabled": True}, headers=admin)


def test_explicit_remember_in_a_turn(real) -> None:  # type: ignore[no-untyped-def]
    client, _, bob = real
    conv = client.post("/v1/conversations", json={}, headers=bob).json()
    _turn(client, bob, conv["id"], "Remember that my favourite colour is teal.")
    facts = client.get("/v1/users/me/memory", headers=bob).json()["data"]
    assert any("teal" in f["text"] and f["source"] == "explicit" for f in facts)
