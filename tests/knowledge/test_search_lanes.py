"""A search embeds nothing but its query before it answers: the user's turns written since
the last search are matched by their words meanwhile and indexed behind it, in the embedding
model's background lane, which streaming answers' moderation keeps busy and which gives way
to the urgent lane before each text."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from chatbox.knowledge import embedder as embedder_module
from chatbox.knowledge.embedder import Embedder
from chatbox.knowledge.search import FRESH_TURNS, SearchService
from chatbox.store import Store


@pytest.fixture
async def store(database: Path | str) -> AsyncIterator[Store]:
    s = await Store.open(database)
    yield s
    await s.close()


@pytest.fixture
def busy(embedder: Embedder) -> Iterator[threading.Event]:
    """The background lane held by other work until the event is set."""
    gate = threading.Event()
    embedder._background.pool.submit(gate.wait)
    yield gate
    gate.set()


async def chat(store: Store, user_id: str, *messages: str) -> str:
    conv = await store.conversations.create(user_id)
    parent = None
    for text in messages:
        parent = (await store.turns.append_user(conv.id, parent, text, user_id)).id
    return conv.id


async def test_new_turns_are_found_by_words_at_once_and_by_meaning_once_indexed_behind(
    store: Store, embedder: Embedder, busy: threading.Event
) -> None:
    ann = await store.users.create("ann")
    otters = await chat(store, ann.id, "How do sea otters sleep at night?")
    await chat(store, ann.id, "Which forms do I need for my taxes?")
    search = SearchService(store, embedder)
    # The background lane is busy: the search answers without embedding the new turns.
    hits = await asyncio.wait_for(search.search(ann.id, "otters resting", "meaning"), 60)
    assert [(h.conversation_id, h.match) for h in hits] == [(otters, "words")]
    assert len(await store.search.unindexed(ann.id, 10)) == 2
    busy.set()
    await asyncio.wait_for(asyncio.gather(*search._tasks), 60)
    assert await store.search.unindexed(ann.id, 10) == []
    hits = await search.search(ann.id, "marine mammals resting", "meaning")
    assert hits and hits[0].conversation_id == otters  # by meaning alone now


async def test_a_new_turn_holding_some_of_the_words_is_found_beside_older_full_matches(
    store: Store, embedder: Embedder
) -> None:
    ann = await store.users.create("ann")
    shed = await chat(store, ann.id, "How do I build a small garden shed from timber?")
    search = SearchService(store, embedder)
    await search.search(ann.id, "first", "both")
    await asyncio.wait_for(asyncio.gather(*search._tasks), 60)  # indexed
    gate = threading.Event()
    embedder._background.pool.submit(gate.wait)
    try:
        tulips = await chat(store, ann.id, "My garden needs tulips this spring.")
        # The words search finds the shed (both words) and so never looks for either word
        # alone; the new turn, not yet searchable by meaning, still shows by its word.
        hits = await asyncio.wait_for(search.search(ann.id, "garden shed", "both"), 60)
    finally:
        gate.set()
    await asyncio.wait_for(asyncio.gather(*search._tasks), 60)
    found = {h.conversation_id: h for h in hits}
    assert found[shed].match in ("words", "both") and found[tulips].match == "words"
    assert found[shed].score > found[tulips].score
    assert "\x02garden\x03" in found[tulips].snippet


async def test_a_conversation_deleted_while_its_turns_wait_to_be_indexed_gets_no_vectors(
    store: Store, embedder: Embedder, busy: threading.Event
) -> None:
    ann = await store.users.create("ann")
    gone = await chat(store, ann.id, "The locker code is 4711", "Keep it safe")
    kept = await chat(store, ann.id, "How do sea otters sleep at night?")
    search = SearchService(store, embedder)
    await asyncio.wait_for(search.search(ann.id, "locker code", "both"), 60)  # indexing queued
    assert await store.conversations.delete(ann.id, gone)
    busy.set()
    await asyncio.wait_for(asyncio.gather(*search._tasks), 60)
    assert await store.search.unindexed(ann.id, 10) == []
    rows = await store.db.fetchall("SELECT rowid FROM turn_vec WHERE user_id = ?", (ann.id,))
    vectors = {int(r["rowid"]) for r in rows}
    seqs = await store.db.fetchall(
        "SELECT seq, conversation_id FROM turns WHERE conversation_id IN (?, ?)", (gone, kept)
    )
    assert vectors == {int(r["seq"]) for r in seqs if r["conversation_id"] == kept}


async def test_a_backlog_is_indexed_behind_the_search(
    store: Store, embedder: Embedder, busy: threading.Event
) -> None:
    ann = await store.users.create("ann")
    messages = [f"Note {i} about garden sheds and timber" for i in range(FRESH_TURNS + 4)]
    conv = await chat(store, ann.id, *messages)
    search = SearchService(store, embedder)
    words = await asyncio.wait_for(search.search(ann.id, "garden sheds", "both"), 60)
    assert {h.conversation_id for h in words} == {conv}  # by its words, at once
    busy.set()
    await asyncio.wait_for(asyncio.gather(*search._tasks), 60)
    meaning = await search.search(ann.id, "wooden outbuilding", "meaning")
    assert meaning and all(h.conversation_id == conv for h in meaning)


async def test_the_background_lane_gives_way_to_an_urgent_encode(
    embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedder_module, "YIELD_MAX_S", 120.0)
    await embedder.embed(["warm up"])  # the lane's model loaded
    with embedder._priority.urgent():  # an urgent encode under way
        background = asyncio.ensure_future(embedder.embed(["an answer's window"]))
        await asyncio.sleep(1.0)
        assert not background.done()
    vectors = await asyncio.wait_for(background, 60)
    assert vectors.shape == (1, embedder.dim)
