"""`chatbox migrate-store --to postgresql://…` copies a SQLite box into PostgreSQL, every table
verified by its count and checksum, and the copy then works as a store."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from chatbox.store import ChunkIn, Store, TurnUsage
from chatbox.store.migrate import copy_store
from chatbox.store.records import Routing
from tests.pg import PgServer

pytestmark = pytest.mark.sqlite_only(reason="moves a box out of its SQLite file")


def unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(384).astype(np.float32)
    return v / np.linalg.norm(v)


async def _fill(path: Path) -> dict[str, str]:
    """A box with rows in the tables a user fills: conversations, turns, drafts, vectors,
    documents, memories, feedback, shares, audit, a deleted (not yet erased) conversation."""
    store = await Store.open(path)
    try:
        ann = await store.users.create("ann", password="ann-password-1234")
        await store.keys.create(ann.id, "laptop")
        conv = await store.conversations.create(ann.id, title="otters")
        q = await store.turns.append_user(conv.id, None, "what do otters eat")
        draft = await store.turns.start_draft(conv.id, q.id, "tiny", Routing("rule", "a", None))
        a = await store.turns.finish_draft(draft, "complete", "Fish, mostly.", TurnUsage(5, 3))
        await store.turns.start_draft(conv.id, a.id, "tiny")  # an answer being written
        await store.search.add_vectors(ann.id, [(q.seq, unit(1)), (a.seq, unit(2))], a.seq)
        await store.memories.add(ann.id, "ann likes otters", unit(3))
        await store.documents.create(
            ann.id, None, "notes.txt", "text/plain", 10, None,
            [ChunkIn(0, None, 0, "otters hold hands while sleeping")], np.stack([unit(4)]),
        )  # fmt: skip
        await store.feedback.add(a.id, conv.id, ann.id, "up", "nice", "tiny", None, "free")
        await store.usage.record(ann.id, "tiny", prompt=5, completion=3)
        await store.audit.append(actor_id=None, actor_name="cli", action="user.create")
        gone = await store.conversations.create(ann.id, title="to be erased")
        await store.turns.append_user(gone.id, None, "a deleted chat")
        assert await store.conversations.delete(ann.id, gone.id)
        return {"user": ann.id, "conv": conv.id, "gone": gone.id}
    finally:
        await store.close()


def _migrate(data: Path, url: str) -> subprocess.CompletedProcess[str]:
    chatbox = Path(sys.executable).with_name("chatbox")
    env = {**os.environ, "CHATBOX_DATA_DIR": str(data)}
    return subprocess.run(
        [str(chatbox), "migrate-store", "--to", url],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_sqlite_box_moves_into_postgresql_verified(tmp_path: Path, postgres: PgServer) -> None:
    data = tmp_path / "data"
    ids = asyncio.run(_fill(data / "chatbox.db"))
    url = postgres.fresh_database()

    done = _migrate(data, url)
    assert done.returncode == 0, done.stderr
    assert "copied and verified" in done.stdout
    table_lines = {line.split()[0]: line for line in done.stdout.splitlines()[:-1]}
    for table in ("users", "turns", "drafts", "memory_vec", "chunk_vec", "turn_vec", "audit_log"):
        assert table_lines[table].endswith("ok"), table_lines[table]
    assert table_lines["turns"].split()[1:3] == ["3", "3"]

    async def use() -> None:
        store = await Store.open(url)
        try:
            user, conv = ids["user"], ids["conv"]
            assert (await store.users.verify_password("ann", "ann-password-1234")) is not None
            hits = await store.search.keyword(user, '"otters"', 5)
            assert {h.role for h in hits} == {"user"}  # the FTS rows were rebuilt
            facts = await store.memories.nearest(user, unit(3), 1)
            assert [m.text for m, _ in facts] == ["ann likes otters"]
            assert await store.conversations.get(user, ids["gone"]) is None  # still deleted
            turn = await store.turns.append_user(conv, None, "and seals?")  # keys continue
            assert turn.seq > 3
        finally:
            await store.close()

    asyncio.run(use())
    again = _migrate(data, url)  # never over a store that is in use
    assert again.returncode != 0 and "already holds users" in again.stderr


async def test_the_check_sees_a_row_that_differs(tmp_path: Path, postgres: PgServer) -> None:
    await _fill(tmp_path / "chatbox.db")
    source = await Store.open(tmp_path / "chatbox.db")
    target = await Store.open(postgres.fresh_database())
    try:
        assert all(t.ok for t in await copy_store(source.db, target.db))
        async with source.db.transaction() as tx:  # the source changes after the copy
            await tx.execute("UPDATE users SET tier = 'paid'")
        from chatbox.store.migrate import _checksum

        cols = [c for c, _ in (await target.db.tables())["users"]]
        assert (await _checksum(source.db, "users", cols))[1] != (
            await _checksum(target.db, "users", cols)
        )[1]
    finally:
        await source.close()
        await target.close()
