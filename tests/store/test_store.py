"""The store: migrations are recorded, turns are append-only, drafts recover as interrupted."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatbox.store import Store, TurnUsage
from chatbox.store.migrations import MIGRATIONS

BOTH_STORES = True  # SQLite and PostgreSQL (tests/conftest.py)


async def test_migrations_are_recorded_once_and_vec_is_loaded(database: Path | str) -> None:
    store = await Store.open(database)
    await store.close()
    store = await Store.open(database)  # reopening applies nothing twice
    rows = await store.db.fetchall("SELECT name FROM migrations ORDER BY applied_at, name")
    assert [r["name"] for r in rows] == [name for name, _ in MIGRATIONS]
    if store.db.dialect == "sqlite":
        assert (await store.db.fetchone("SELECT vec_version()"))[0].startswith("v")
        assert (await store.db.fetchone("PRAGMA journal_mode"))[0] == "wal"
    await store.close()


async def test_turns_cannot_be_rewritten(database: Path | str) -> None:
    store = await Store.open(database)
    user = await store.users.ensure_local_user()
    conv = await store.conversations.create(user.id)
    turn = await store.turns.append_user(conv.id, None, "hello")
    with pytest.raises(Exception, match="append-only"):
        async with store.db.transaction() as tx:
            await tx.execute("UPDATE turns SET content = 'changed' WHERE id = ?", (turn.id,))
    assert (await store.turns.get(conv.id, turn.id)).content == "hello"  # type: ignore[union-attr]
    await store.close()


async def test_a_draft_becomes_one_turn(database: Path | str) -> None:
    store = await Store.open(database)
    user = await store.users.ensure_local_user()
    conv = await store.conversations.create(user.id)
    question = await store.turns.append_user(conv.id, None, "What is 2+2?")
    draft = await store.turns.start_draft(conv.id, question.id, "tiny")
    await store.turns.update_draft(draft, "It is")
    answer = await store.turns.finish_draft(draft, "complete", "It is 4.", TurnUsage(10, 3, 2))
    assert (answer.status, answer.content, answer.completion_tokens) == ("complete", "It is 4.", 3)
    with pytest.raises(KeyError):  # written exactly once
        await store.turns.finish_draft(draft, "stopped", "It is", TurnUsage())
    assert await store.turns.recover_drafts() == 0
    path = await store.turns.path(conv.id, answer.id)
    assert [t.id for t in path] == [question.id, answer.id]
    await store.close()


async def test_text_holding_a_nul_character_is_stored(database: Path | str) -> None:
    """A model can write U+0000 (a byte-level vocabulary has a token for it): the answer is
    stored and read back, on PostgreSQL (whose text refuses it) as U+FFFD."""
    store = await Store.open(database)
    user = await store.users.ensure_local_user()
    conv = await store.conversations.create(user.id)
    question = await store.turns.append_user(conv.id, None, "say \x00 back")
    draft = await store.turns.start_draft(conv.id, question.id, "tiny")
    await store.turns.update_draft(draft, "a\x00")
    answer = await store.turns.finish_draft(draft, "complete", "a\x00b", TurnUsage(3, 2, 0))
    stands_for = "\x00" if store.db.dialect == "sqlite" else "\ufffd"
    path = await store.turns.path(conv.id, answer.id)
    assert [t.content for t in path] == [f"say {stands_for} back", f"a{stands_for}b"]
    await store.close()


async def test_unfinished_drafts_recover_as_interrupted(database: Path | str) -> None:
    store = await Store.open(database)
    user = await store.users.ensure_local_user()
    conv = await store.conversations.create(user.id)
    question = await store.turns.append_user(conv.id, None, "Tell me a story")
    draft = await store.turns.start_draft(conv.id, question.id, "tiny", user_id=user.id)
    await store.turns.update_draft(draft, "Once upon a", TurnUsage(12, 3))
    await store.close()

    store = await Store.open(database)
    assert await store.turns.recover_drafts() == 1
    conv2 = await store.conversations.get(user.id, conv.id)
    assert conv2 is not None and conv2.active_leaf_id == draft
    turn = await store.turns.get(conv.id, draft)
    assert turn is not None and (turn.status, turn.content) == ("interrupted", "Once upon a")
    assert (turn.prompt_tokens, turn.completion_tokens) == (12, 3)
    # Its front never charged it: the recovery does, to whoever asked, exactly once.
    [row] = await store.usage.report()
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (1, 12, 3)
    assert await store.turns.recover_drafts() == 0
    assert [r.requests for r in await store.usage.report()] == [1]
    assert await store.db.integrity_ok()
    await store.close()


async def test_other_users_do_not_see_a_conversation(database: Path | str) -> None:
    store = await Store.open(database)
    alice = await store.users.create("alice")
    bob = await store.users.create("bob")
    conv = await store.conversations.create(alice.id, title="secret")
    assert await store.conversations.get(bob.id, conv.id) is None
    assert await store.conversations.list(bob.id) == []
    assert await store.conversations.update(bob.id, conv.id, title="mine") is None
    assert not await store.conversations.delete(bob.id, conv.id)
    assert (await store.conversations.get(alice.id, conv.id)).title == "secret"  # type: ignore[union-attr]
    await store.close()


@pytest.mark.sqlite_only(reason="a WAL checkpoint refused by a read on the same SQLite connection")
async def test_a_checkpoint_behind_an_open_read_waits_its_turn(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "chatbox.db")
    try:
        db = store.db
        for i in range(3):
            await db.conn.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (f"k{i}", "v"))
        await db.conn.commit()
        cursor = await db.conn.execute("SELECT key FROM meta")
        assert await cursor.fetchone() is not None  # a statement left open mid-read
        await db.checkpoint()  # waits, then leaves the WAL for the next one: no error
        await cursor.close()
        await db.checkpoint()
    finally:
        await store.close()


async def test_a_write_cancelled_at_any_point_leaves_the_next_one_working(
    database: Path | str,
) -> None:
    """A request cancelled (a client gone, a timeout) while its transaction begins, runs or
    commits leaves no transaction open: the next write goes through. A BEGIN whose caller
    was cancelled used to run on in the driver's thread, and every later write was refused
    ("cannot start a transaction within a transaction")."""
    import asyncio

    store = await Store.open(database)
    try:
        db = store.db

        async def write(key: str) -> None:
            async with db.transaction() as tx:
                await tx.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (key, "v"))

        for i in range(40):
            task = asyncio.create_task(write(f"cancelled-{i}"))
            for _ in range(i % 8):  # cancel it at a different await each time
                await asyncio.sleep(0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await asyncio.wait_for(write(f"after-{i}"), 10)
        rows = await db.fetchall("SELECT key FROM meta WHERE key LIKE 'after-%'")
        assert len(rows) == 40
    finally:
        await store.close()
