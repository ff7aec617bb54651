"""Search never waits on the embedding model's background lane, which streaming answers'
moderation keeps busy: turns written since the last search are embedded in the query's own
urgent batch, and a long backlog is indexed behind the search."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from chatbox.knowledge.embedder import Embedder
from chatbox.knowledge.search import URGENT_TURNS, SearchService
from chatbox.store import Store


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = await Store.open(tmp_path / "s.db")
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


async def test_new_turns_are_found_by_meaning_while_the_background_lane_is_busy(
    store: Store, embedder: Embedder, busy: threading.Event
) -> None:
    ann = await store.users.create("ann")
    otters = await chat(store, ann.id, "How do sea otters sleep at night?")
    await chat(store, ann.id, "Which forms do I need for my taxes?")
    search = SearchService(store, embedder)
    hits = await asyncio.wait_for(search.search(ann.id, "otters resting", "meaning"), 60)
    assert hits and hits[0].conversation_id == otters


async def test_a_backlog_is_indexed_behind_the_search(
    store: Store, embedder: Embedder, busy: threading.Event
) -> None:
    ann = await store.users.create("ann")
    messages = [f"Note {i} about garden sheds and timber" for i in range(URGENT_TURNS + 4)]
    conv = await chat(store, ann.id, *messages)
    search = SearchService(store, embedder)
    words = await asyncio.wait_for(search.search(ann.id, "garden sheds", "both"), 60)
    assert {h.conversation_id for h in words} == {conv}  # by its words, at once
    busy.set()
    await asyncio.wait_for(asyncio.gather(*search._tasks), 60)
    meaning = await search.search(ann.id, "wooden outbuilding", "meaning")
    assert meaning and all(h.conversation_id == conv for h in meaning)
