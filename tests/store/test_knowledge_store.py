"""Knowledge tables: vectors partitioned by user, cascades, FTS kept in step by triggers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from chatbox.store import ChunkIn, Store

BOTH_STORES = True  # SQLite and PostgreSQL (tests/conftest.py)


@pytest.fixture
async def store(database: Path | str):  # type: ignore[no-untyped-def]
    s = await Store.open(database)
    yield s
    await s.close()


def unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(384).astype(np.float32)
    return v / np.linalg.norm(v)


async def test_memory_knn_never_crosses_users(store: Store) -> None:
    ana = await store.users.create("ana")
    bob = await store.users.create("bob")
    target = unit(1)
    await store.memories.add(bob.id, "bob's secret", target)  # the exact match, but Bob's
    for i in range(5):
        await store.memories.add(ana.id, f"ana fact {i}", unit(10 + i))
    hits = await store.memories.nearest(ana.id, target, 10)
    assert len(hits) == 5 and all(m.user_id == ana.id for m, _ in hits)
    assert [m.text for m, _ in await store.memories.nearest(bob.id, target, 1)] == ["bob's secret"]
    assert await store.memories.delete(ana.id, [hits[0][0].id, "m_nope"]) == [hits[0][0].id]
    assert await store.memories.delete(ana.id, [(await store.memories.list(bob.id))[0].id]) == []


async def test_bulk_insert_continues_after_deletes(store: Store) -> None:
    ana = await store.users.create("ana")
    one = await store.memories.add(ana.id, "one", unit(1))
    await store.memories.delete(ana.id, [one.id])
    vectors = np.stack([unit(i) for i in range(3)])
    assert await store.memories.add_many(ana.id, ["a", "b", "c"], vectors) == 3
    seqs = sorted(m.seq for m in await store.memories.list(ana.id))
    assert seqs[0] > one.seq  # a deleted fact's rowid is never reused
    [(hit, dist)] = await store.memories.nearest(ana.id, unit(2), 1)
    assert hit.text == "c" and dist < 1e-3


async def test_document_delete_cascades_to_chunks_vectors_fts(store: Store) -> None:
    ana = await store.users.create("ana")
    conv = await store.conversations.create(ana.id)
    chunks = [ChunkIn(0, 1, 0, "descale with citric acid"), ChunkIn(1, 2, 0, "warranty terms")]
    doc = await store.documents.create(
        ana.id, conv.id, "m.pdf", "application/pdf", 10, 2, chunks, np.stack([unit(1), unit(2)])
    )
    assert doc.chunks == 2
    kw = await store.documents.keyword_chunks(ana.id, conv.id, '"citric"', 5)
    assert [c.text for c, _ in kw] == ["descale with citric acid"]
    other = await store.conversations.create(ana.id)
    assert await store.documents.keyword_chunks(ana.id, other.id, '"citric"', 5) == []
    assert await store.documents.delete(ana.id, doc.id)
    assert await store.documents.keyword_chunks(ana.id, conv.id, '"citric"', 5) == []
    assert await store.documents.nearest_chunks(ana.id, conv.id, unit(1), 5) == []
    row = await store.db.fetchone("SELECT count(*) FROM chunk_vec")
    assert row[0] == 0


async def test_citing_for_an_answer_erased_meanwhile_records_nothing(store: Store) -> None:
    """The answer's conversation was deleted while its citations were being recorded (on
    PostgreSQL the foreign key refused the row, and the error was logged)."""
    ana = await store.users.create("ana")
    conv = await store.conversations.create(ana.id)
    chunks = [ChunkIn(0, 1, 0, "descale with citric acid")]
    await store.documents.create(
        ana.id, conv.id, "m.pdf", "application/pdf", 10, 1, chunks, np.stack([unit(1)])
    )
    seq = (await store.db.fetchone("SELECT seq FROM chunks"))[0]
    await store.documents.cite("t_erased", [(seq, 0.9), (seq + 1000, 0.5)])
    assert (await store.db.fetchone("SELECT count(*) FROM turn_citations"))[0] == 0


async def test_turns_are_searchable_by_words_only_by_their_owner(store: Store) -> None:
    ana = await store.users.create("ana")
    bob = await store.users.create("bob")
    conv = await store.conversations.create(ana.id)
    await store.turns.append_user(conv.id, None, "my sourdough starter smells odd")
    assert [h.conversation_id for h in await store.search.keyword(ana.id, '"sourdough"', 5)] == [
        conv.id
    ]
    assert await store.search.keyword(bob.id, '"sourdough"', 5) == []
    pending = await store.search.unindexed(ana.id, 10)
    assert len(pending) == 1
    await store.search.add_vectors(ana.id, [(pending[0][0], unit(3))], pending[0][0])
    await store.search.add_vectors(ana.id, [(pending[0][0], unit(3))], pending[0][0])  # a race
    assert await store.search.unindexed(ana.id, 10) == []
    assert len(await store.search.semantic(ana.id, unit(3), 5)) == 1
    assert await store.search.semantic(bob.id, unit(3), 5) == []
