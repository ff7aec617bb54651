"""The in-RAM vector index: exact (matches a numpy scan and sqlite-vec's ranking), kept in step
with every write (deletes included), per-user, and correct when the budget evicts or refuses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from chatbox.knowledge.embedder import Embedder
from chatbox.knowledge.memory import MemoryService
from chatbox.knowledge.retrieval import Retriever
from chatbox.knowledge.search import SearchService
from chatbox.knowledge.vector_index import VectorIndex
from chatbox.store import ChunkIn, Store

DIM = 384


@pytest.fixture
async def store(database: Path | str) -> AsyncIterator[Store]:
    s = await Store.open(database)
    yield s
    await s.close()


def vectors(n: int, seed: int, unit: bool = True) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True) if unit else x


def exact(x: np.ndarray, seqs: list[int], q: np.ndarray, k: int) -> list[int]:
    d = np.linalg.norm(x.astype(np.float64) - q.astype(np.float64), axis=1)
    return [seqs[i] for i in np.argsort(d)[:k]]


async def fill(store: Store, user: str, x: np.ndarray) -> list[int]:
    await store.memories.add_many(user, [f"f{i}" for i in range(len(x))], x)
    return sorted(m.seq for m in await store.memories.list(user))


async def test_partition_read_matches_a_vec0_scan(store: Store) -> None:
    ana, bob = (await store.users.create("ana")).id, (await store.users.create("bob")).id
    xa = vectors(2500, 1)  # more than one vec0 chunk (1024 slots)
    seqs = await fill(store, ana, xa)
    await fill(store, bob, vectors(300, 2))
    doomed = await store.memories.list(ana)
    await store.memories.delete(ana, [m.id for m in doomed[:40]])
    loaded = await store.vectors.partition("memory_vec", ana)
    assert loaded is not None
    ids, mat = loaded
    keep = {m.seq for m in doomed[40:]}
    assert sorted(ids.tolist()) == sorted(keep) == sorted(s for s in seqs if s in keep)
    by_seq = dict(zip(seqs, xa, strict=True))
    assert all(np.array_equal(mat[i], by_seq[int(s)]) for i, s in enumerate(ids))
    assert await store.vectors.partition("memory_vec", ana, max_rows=100) is None


@pytest.mark.sqlite_only(reason="sqlite-vec's vec0 chunks, read without knowing their layout")
async def test_the_plain_vec0_scan_reads_the_rows_of_the_fast_read(store: Store) -> None:
    ana, bob = (await store.users.create("ana")).id, (await store.users.create("bob")).id
    await fill(store, ana, vectors(2500, 1))  # more than one vec0 chunk (1024 slots)
    await fill(store, bob, vectors(300, 2))
    doomed = await store.memories.list(ana)
    await store.memories.delete(ana, [m.id for m in doomed[:40]])
    loaded = await store.vectors.partition("memory_vec", ana)
    assert loaded is not None
    plain = await store.vectors._partition_plain("memory_vec", ana, None)
    assert plain is not None and sorted(plain[0].tolist()) == sorted(loaded[0].tolist())


@pytest.mark.parametrize("unit", [True, False])
async def test_top_k_is_the_exact_scan_and_sqlite_vec_ranking(store: Store, unit: bool) -> None:
    user = (await store.users.create("ana")).id
    x = vectors(3000, 3, unit)
    seqs = await fill(store, user, x)
    index = VectorIndex(store, 1 << 30)
    try:
        for q in vectors(25, 4, unit):
            got = await index.nearest("memory_vec", user, q, 10)
            assert got is not None
            assert [s for s, _ in got] == exact(x, seqs, q, 10)
            ref = await store.memories.nearest(user, q, 10)  # sqlite-vec KNN
            assert [s for s, _ in got] == [m.seq for m, _ in ref]
            assert np.allclose([d for _, d in got], [d for _, d in ref], atol=1e-4)
        assert index.loaded("memory_vec", user)
    finally:
        index.close()


async def test_inserts_replacements_and_deletes_are_seen_at_once(
    store: Store, embedder: Embedder
) -> None:
    user = (await store.users.create("ana")).id
    await fill(store, user, vectors(200, 5))
    index = VectorIndex(store, 1 << 30)
    memory = MemoryService(store, embedder, index)
    try:
        q = vectors(1, 6)[0]
        await memory.nearest(user, q, 5)  # loads the partition
        assert index.loaded("memory_vec", user)
        added = await store.memories.add(user, "the target", q)
        [(hit, dist)] = await memory.nearest(user, q, 1)
        assert hit.id == added.id and dist < 1e-3
        other = vectors(1, 7)[0]
        await store.memories.replace(user, added.id, "moved", other, "explicit")
        [(hit, _)] = await memory.nearest(user, other, 1)
        assert hit.id == added.id and hit.text == "moved"
        assert (await memory.nearest(user, q, 1))[0][0].id != added.id
        # deleting a fact takes it out of the index too (not only out of the join)
        assert await memory.remove(user, [added.id]) == [added.id]
        got = await index.nearest("memory_vec", user, other, 300)
        assert got is not None and added.seq not in {s for s, _ in got} and len(got) == 200
        # a fact learnt through the service (embedded) is found, then forgotten
        [change] = await memory.add(user, ["The user lives in Lisbon"])
        found = await memory.relevant(user, await embedder.embed_one("Where do I live?"), 3)
        assert change.memory.id in [m.id for m, _ in found]
        assert change.memory.id in await memory.forget(user, "that I live in Lisbon")
        got = await index.nearest("memory_vec", user, q, 300)
        assert got is not None and change.memory.seq not in {s for s, _ in got}
    finally:
        index.close()


async def test_a_user_never_gets_another_users_vectors(store: Store) -> None:
    ana, bob = (await store.users.create("ana")).id, (await store.users.create("bob")).id
    xa, xb = vectors(400, 8), vectors(400, 9)
    sa, sb = await fill(store, ana, xa), await fill(store, bob, xb)
    index = VectorIndex(store, 1 << 30)
    try:
        for q in xb[:10]:  # Bob's exact vectors, asked for by Ana
            got = await index.nearest("memory_vec", ana, q, 50)
            assert got is not None and {s for s, _ in got} <= set(sa)
        later = await store.memories.add(bob, "bob's", xa[0])  # Bob writes near Ana's
        got = await index.nearest("memory_vec", ana, xa[0], 5)
        assert got is not None and got[0][0] == sa[0] and later.seq not in {s for s, _ in got}
        got = await index.nearest("memory_vec", bob, xa[0], 1)
        assert got is not None and got[0][0] == later.seq and set(sb).isdisjoint(sa)
    finally:
        index.close()


async def test_tiny_budget_evicts_or_falls_back_and_stays_correct(
    store: Store, embedder: Embedder
) -> None:
    users = [(await store.users.create(f"u{i}")).id for i in range(3)]
    data = {u: vectors(300, 10 + i) for i, u in enumerate(users)}
    seqs = {u: await fill(store, u, data[u]) for u in users}
    one = 400 * (DIM * 4 + 12)  # room for about one 300-row partition
    index = VectorIndex(store, one)
    memory = MemoryService(store, embedder, index)
    try:
        for _ in range(2):
            for u in users:
                q = data[u][7]
                got = await memory.nearest(u, q, 10)
                assert [m.seq for m, _ in got] == exact(data[u], seqs[u], q, 10)
        assert index.nbytes <= one and sum(index.loaded("memory_vec", u) for u in users) == 1
        # a budget no partition fits: every query is sqlite-vec's, and still right
        none = VectorIndex(store, 10_000)
        tight = MemoryService(store, embedder, none)
        q = data[users[1]][3]
        assert [m.seq for m, _ in await tight.nearest(users[1], q, 10)] == exact(
            data[users[1]], seqs[users[1]], q, 10
        )
        assert await none.nearest("memory_vec", users[1], q, 10) is None
        none.close()
    finally:
        index.close()


async def test_chunks_and_turns_come_from_the_index_in_scope(
    store: Store, embedder: Embedder
) -> None:
    ana = (await store.users.create("ana")).id
    here, there = (
        (await store.conversations.create(ana)).id,
        (await store.conversations.create(ana)).id,
    )
    x = vectors(6, 20)
    chunks = [ChunkIn(i, 1, 0, f"passage {i}") for i in range(3)]
    await store.documents.create(ana, here, "a.txt", "text/plain", 1, None, chunks, x[:3])
    other = await store.documents.create(ana, there, "b.txt", "text/plain", 1, None, chunks, x[3:])
    index = VectorIndex(store, 1 << 30)
    retriever = Retriever(store, embedder, MemoryService(store, embedder, index), 4, 4, index=index)
    try:
        got = await retriever.nearest_chunks(ana, here, x[4], 3)  # nearest is out of scope
        assert {c.document_name for c, _ in got} == {"a.txt"}
        ref = await store.documents.nearest_chunks(ana, here, x[4], 3)
        assert [c.seq for c, _ in got] == [c.seq for c, _ in ref]
        got = await retriever.nearest_chunks(ana, there, x[4], 1)
        assert got[0][0].document_name == "b.txt" and got[0][1] < 1e-3
        await store.documents.delete(ana, other.id)  # its vectors leave the index
        hits = await index.nearest("chunk_vec", ana, x[4], 10)
        assert hits is not None and len(hits) == 3
        # turn vectors for search
        turn = await store.turns.append_user(here, None, "hello there")
        await store.search.add_vectors(ana, [(turn.seq, x[5])], turn.seq)
        search = SearchService(store, embedder, index)
        [hit] = await search.semantic(ana, x[5], 5)
        assert hit.turn_id == turn.id and hit.score < 1e-3
    finally:
        index.close()
