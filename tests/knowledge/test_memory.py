"""Memory on the real embedding model: dedup, correction, retrieval, isolation, extraction
parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatbox.knowledge.embedder import Embedder
from chatbox.knowledge.extraction import grounded_facts, stated_facts
from chatbox.knowledge.memory import MemoryService, conflicts, explicit_fact
from chatbox.store import Store


@pytest.fixture
async def store(database: Path | str):  # type: ignore[no-untyped-def]
    s = await Store.open(database)
    yield s
    await s.close()


async def test_embeddings_are_unit_and_meaningful(embedder: Embedder) -> None:
    v = await embedder.embed(
        ["I prefer metric units", "Use kilometres and kilograms", "My cat is called Tom"]
    )
    assert v.shape == (3, 384)
    assert abs(float((v[0] ** 2).sum()) - 1.0) < 1e-4
    assert float(v[0] @ v[1]) > float(v[0] @ v[2])


async def test_add_merge_replace_and_retrieve(store: Store, embedder: Embedder) -> None:
    ana = await store.users.create("ana")
    bob = await store.users.create("bob")
    memory = MemoryService(store, embedder)
    changes = await memory.add(
        ana.id,
        [
            "The user prefers metric units",
            "The user works on the billing service",
            "The user lives in Paris",
        ],
    )
    assert [c.action for c in changes] == ["added"] * 3
    # A near-duplicate is merged; a contradiction replaces the old fact.
    again = await memory.add(ana.id, ["The user prefers metric units."])
    assert again[0].action == "merged"
    moved = await memory.add(ana.id, ["The user lives in Berlin"])
    assert moved[0].action == "replaced" and moved[0].previous == "The user lives in Paris"
    texts = {m.text for m in await memory.list(ana.id)}
    assert texts == {
        "The user prefers metric units",
        "The user works on the billing service",
        "The user lives in Berlin",
    }
    await memory.add(bob.id, ["The user prefers imperial units"])

    query = await embedder.embed_one("How tall is a 2 metre door in the units I like?")
    top = await memory.relevant(ana.id, query, 1)
    assert top[0][0].text == "The user prefers metric units"
    # Bob's facts are never among Ana's, however close.
    hits = await memory.relevant(ana.id, await embedder.embed_one("imperial units"), 10)
    assert all(m.user_id == ana.id for m, _ in hits)
    assert "imperial" not in " ".join(m.text for m, _ in hits)


async def test_delete_removes_vector(store: Store, embedder: Embedder) -> None:
    ana = await store.users.create("ana")
    memory = MemoryService(store, embedder)
    [change] = await memory.add(ana.id, ["The user has a dog named Rex"])
    assert await memory.remove(ana.id, [change.memory.id]) == [change.memory.id]
    row = await store.db.fetchone(
        "SELECT count(*) FROM memory_vec WHERE rowid = ?", (change.memory.seq,)
    )
    assert row[0] == 0
    assert await memory.relevant(ana.id, await embedder.embed_one("dog"), 5) == []


def test_explicit_and_conflict_rules() -> None:
    assert explicit_fact("Remember that I prefer metric units.") == "I prefer metric units"
    assert explicit_fact("please remember: my cat is Tom") == "my cat is Tom"
    assert explicit_fact("I remember that day") is None
    assert conflicts("The user lives in Paris", "I live in Berlin")
    assert conflicts("My name is Ana", "My name is Bob")
    assert not conflicts("has a dog named Rex", "has a cat")
    assert not conflicts("likes tea", "likes coffee")


def test_extraction_parsing_keeps_only_grounded_facts() -> None:
    said = "My name is Dana and I live in Lisbon. Can you suggest a weekend plan?"
    assert stated_facts(said) == ["The user's name is Dana", "The user lives in Lisbon"]
    # A small model's invention ("sailor") is dropped; the grounded clause stays.
    assert grounded_facts("- Dana is a sailor and I live in Lisbon", said) == [
        "The user lives in Lisbon"
    ]
    assert grounded_facts("- none", said) == []
