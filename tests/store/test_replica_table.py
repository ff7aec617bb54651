"""The replica table: drains kept by URL (a command-line replica's too), and, for fronts on
one PostgreSQL database, the placements and OpenAI-kind loads they share."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatbox.store import Store
from tests.pg import PgServer

BOTH_STORES = True  # SQLite and PostgreSQL (tests/conftest.py)
FLAG = "http://flag:9001"  # a replica some front names on its command line
TABLE = "http://table:9001"


async def test_a_drain_is_kept_by_url_and_goes_with_a_table_replica(database: Path | str) -> None:
    store = await Store.open(database)
    try:
        repo = store.replicas
        await repo.upsert(TABLE, "chatbox")
        await repo.set_draining(FLAG, True)
        await repo.set_draining(TABLE, True)
        assert await repo.drains() == {FLAG, TABLE}
        assert [(r.url, r.draining) for r in await repo.list()] == [(TABLE, True)]
        # Removing a command-line replica (on one front) leaves its drain to the others.
        assert await repo.remove(FLAG) is False
        assert await repo.remove(TABLE) is True
        assert await repo.drains() == {FLAG}
        await repo.set_draining(FLAG, False)
        assert await repo.drains() == set()
        # Adding a replica again takes it out of its drain.
        await repo.set_draining(TABLE, True)
        await repo.upsert(TABLE, "chatbox")
        assert await repo.drains() == set()
    finally:
        await store.close()


async def test_fronts_share_placements_and_their_loads(postgres: PgServer) -> None:
    url = postgres.fresh_database()
    a, b = await Store.open(url), await Store.open(url)
    try:
        assert await b.replicas.placement("c_1") is None
        await a.replicas.place("c_1", TABLE)
        assert await b.replicas.placement("c_1") == TABLE
        await b.replicas.place("c_1", FLAG)  # moved on: the latest placement holds
        assert await a.replicas.placement("c_1") == FLAG
        assert await a.replicas.forget_placements(3600) == 0
        assert await a.replicas.share_loads({(TABLE, "tiny"): 2}, 5) == {}
        assert await b.replicas.share_loads({(TABLE, "tiny"): 1}, 5) == {(TABLE, "tiny"): 2}
        assert await a.replicas.share_loads({(TABLE, "tiny"): 0}, 5) == {(TABLE, "tiny"): 1}
        assert await b.replicas.share_loads({}, 5) == {}  # A has nothing there now
    finally:
        await a.close()
        await b.close()


@pytest.mark.sqlite_only(reason="SQLite's one front keeps its placements to itself")
async def test_one_front_on_sqlite_keeps_placements_and_loads_to_itself(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "chatbox.db")
    try:
        await store.replicas.place("c_1", TABLE)
        assert await store.replicas.placement("c_1") is None
        assert await store.replicas.share_loads({(TABLE, "tiny"): 2}, 5) == {}
    finally:
        await store.close()
