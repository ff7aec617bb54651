"""Fronts sharing one PostgreSQL database: each answer's draft names its front, and only the
answers of fronts that are gone are stored as interrupted."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from chatbox.store import Store
from chatbox.store.run_channel import FRONT_LOCK, RunChannel
from tests.pg import PgServer


async def test_only_a_gone_fronts_answers_are_recovered(postgres: PgServer) -> None:
    url = postgres.fresh_database()
    a = await Store.open(url)
    user = await a.users.ensure_local_user()
    conv = await a.conversations.create(user.id)
    question = await a.turns.append_user(conv.id, None, "Tell me a story")
    draft = await a.turns.start_draft(conv.id, question.id, "tiny")
    await a.turns.update_draft(draft, "Once upon a")
    assert a.db.runs is not None
    b = await Store.open(url)  # a second front starts while the first writes its answer
    try:
        assert b.db.runs is not None
        alive = await b.db.runs.live_fronts()
        assert {a.db.runs.front, b.db.runs.front} <= alive
        assert await b.turns.recover_drafts(alive) == 0
        found = await b.turns.draft(draft)
        assert found is not None and found.front == a.db.runs.front
        assert found.content == "Once upon a"

        await a.close()  # the first front is gone, and with it its lock
        alive = await b.db.runs.live_fronts()
        assert a.db.runs.front not in alive and b.db.runs.front in alive
        assert await b.turns.recover_drafts(alive) == 1
        turn = await b.turns.get(conv.id, draft)
        assert turn is not None and (turn.status, turn.content) == ("interrupted", "Once upon a")
        assert await b.turns.draft(draft) is None
    finally:
        await b.close()


async def test_a_front_cut_off_takes_its_own_lock_again(postgres: PgServer) -> None:
    url = postgres.fresh_database()
    a, b = await Store.open(url), await Store.open(url)
    try:
        assert a.db.runs is not None and b.db.runs is not None
        old = a.db.runs.front
        # The database drops the connection that holds the first front's lock.
        await b.db.fetchone(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
            " AND classid = ? AND objid = ? AND objsubid = 2",
            (FRONT_LOCK, int(old)),
        )
        gone = False
        for _ in range(100):
            await asyncio.sleep(0.05)
            alive = await b.db.runs.live_fronts()
            gone = gone or old not in alive
            if gone and old in alive:
                break
        # Under the same name: its drafts are still its own, so nothing is taken over.
        assert gone and a.db.runs.front == old and old in await b.db.runs.live_fronts()
    finally:
        await a.close()
        await b.close()


async def test_a_reconnect_waits_briefly_for_its_lock_a_dropped_session_still_holds(
    postgres: PgServer,
) -> None:
    """The lock of a connection the database is still closing is taken as soon as it goes,
    not after a retry seconds later; one that stays held is refused after LOCK_WAIT_S."""
    url = postgres.fresh_database()
    channel = RunChannel(url)
    dying = await asyncpg.connect(url)  # the dropped session, on its way out
    await dying.execute("SELECT pg_advisory_lock($1, $2)", FRONT_LOCK, channel.key)
    release = asyncio.get_running_loop().call_later(
        0.3, lambda: asyncio.ensure_future(dying.close())
    )
    try:
        await channel.open()  # waits for the lock (up to LOCK_WAIT_S), else ConnectionError
        assert channel.front in await channel.live_fronts()
    finally:
        release.cancel()
        await channel.close()
        if not dying.is_closed():
            await dying.close()

    stuck = await asyncpg.connect(url)  # a session that keeps it (a network cut off)
    other = RunChannel(url)
    await stuck.execute("SELECT pg_advisory_lock($1, $2)", FRONT_LOCK, other.key)
    try:
        with pytest.raises(ConnectionError, match="still held"):
            await other.open()
    finally:
        await other.close()
        await stuck.close()


async def test_a_front_whose_connection_closed_unannounced_takes_its_lock_again(
    postgres: PgServer,
) -> None:
    """A connection cut while a statement runs on it closes without calling its
    termination listener: the front's next use of it finds it closed and reconnects."""
    url = postgres.fresh_database()
    a, b = RunChannel(url), RunChannel(url)
    await a.open()
    await b.open()
    try:
        assert a._conn is not None
        a._conn.remove_termination_listener(a._on_lost)  # the cut goes unannounced
        await b.live_fronts()
        assert b._conn is not None
        await b._conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
            " AND classid = $1 AND objid = $2 AND objsubid = 2",
            FRONT_LOCK,
            a.key,
        )
        back = False
        for _ in range(100):
            await a.send({"op": "ping"})  # fails on the closed connection the first time
            await asyncio.sleep(0.05)
            back = a.front in await b.live_fronts()
            if back:
                break
        assert back
    finally:
        await a.close()
        await b.close()
