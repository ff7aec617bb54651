"""What an erasure leaves in PostgreSQL's data directory, and the maintenance that removes it
(docs/data-handling.md): ANALYZE never samples a content column into `pg_statistic`, and
after `VACUUM FULL`, then `pg_switch_wal()` and `CHECKPOINT` twice, no file of the database
and no WAL segment holds an erased word."""

from __future__ import annotations

from pathlib import Path

import asyncpg

from chatbox.store import Store
from chatbox.store.content import content_columns
from chatbox.store.erasure import ErasureRepo
from tests.pg import PgServer

WORD = "okapicanary3318"  # a word nothing else writes
KEPT = "tapirkeeper6604"


def files_holding(root: Path, needle: str) -> list[str]:
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and needle.encode() in p.read_bytes()
    )


async def sampled(conn: asyncpg.Connection, needle: str) -> list[str]:
    """The columns whose statistics (`pg_statistic`'s sampled values) hold `needle`."""
    rows = await conn.fetch(
        "SELECT starelid::regclass::text || '.' || staattnum AS col FROM pg_statistic WHERE"
        " concat(stavalues1::text, stavalues2::text, stavalues3::text, stavalues4::text,"
        " stavalues5::text) ILIKE $1",
        f"%{needle}%",
    )
    return [r["col"] for r in rows]


async def test_every_content_column_is_kept_out_of_analyze(postgres: PgServer) -> None:
    url = postgres.fresh_database()
    store = await Store.open(url)
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT c.relname, a.attname, a.attstattarget FROM pg_attribute a"
            " JOIN pg_class c ON c.oid = a.attrelid WHERE a.attnum > 0 AND NOT a.attisdropped"
        )
        target = {(r["relname"], r["attname"]): r["attstattarget"] for r in rows}
        assert {col: target.get(col) for col in content_columns()} == {
            col: 0 for col in content_columns()
        }
        assert target[("turns", "conversation_id")] != 0  # the rest is sampled as before
        # A column sampled before (a database analyzed by an older version): its samples go.
        await conn.execute("ALTER TABLE turns ALTER COLUMN content SET STATISTICS -1")
        user = await store.users.ensure_local_user()
        conv = await store.conversations.create(user.id)
        for n in range(20):  # enough rows for ANALYZE to keep bounds
            await store.turns.append_user(conv.id, None, f"filler message {n}")
        await store.turns.append_user(conv.id, None, f"the code is {WORD}")
        await conn.execute("ANALYZE turns")
        assert await sampled(conn, WORD), "the test needs a sampled value first"
    finally:
        await conn.close()
        await store.close()
    store = await Store.open(url)  # the next start
    conn = await asyncpg.connect(url)
    try:
        assert await sampled(conn, WORD) == []
        await conn.execute("ANALYZE turns")
        assert await sampled(conn, WORD) == []
    finally:
        await conn.close()
        await store.close()


async def test_an_erased_word_leaves_the_data_directory_after_the_documented_steps(
    postgres: PgServer,
) -> None:
    url = postgres.fresh_database()
    store = await Store.open(url)
    conn = await asyncpg.connect(url)
    try:
        user = await store.users.ensure_local_user()
        kept = await store.conversations.create(user.id)
        await store.turns.append_user(kept.id, None, f"the shed code is {KEPT}")
        for n in range(20):  # enough rows for ANALYZE to keep common values and bounds
            other = await store.conversations.create(user.id)
            await store.turns.append_user(other.id, None, f"filler message {n}")
        conv = await store.conversations.create(user.id, title=f"about {WORD}")
        await store.turns.append_user(conv.id, None, f"my locker code is {WORD}, remember it")
        oid = await conn.fetchval("SELECT oid FROM pg_database WHERE datname = current_database()")
        base = postgres.data / "base" / str(oid)
        await conn.execute("ANALYZE")  # as autovacuum does on its own
        await conn.execute("CHECKPOINT")
        assert files_holding(base, WORD), "the test needs a trace first"
        assert await sampled(conn, WORD) == []  # never sampled

        # The documented setting: spent WAL segments are deleted, not reused as they are.
        await conn.execute("ALTER SYSTEM SET wal_recycle = off")
        await conn.execute("SELECT pg_reload_conf()")
        await ErasureRepo(store.db).conversations(user.id, [conv.id])
        # The documented steps: VACUUM FULL rewrites every table and index without the
        # erased rows; WAL segments holding them go once two checkpoints have passed them.
        await conn.execute("VACUUM FULL")
        for _ in range(2):
            await conn.execute("SELECT pg_switch_wal()")
            await conn.execute("CHECKPOINT")

        assert files_holding(base, WORD) == []
        assert files_holding(postgres.data / "pg_wal", WORD) == []
        assert await sampled(conn, WORD) == []
        assert files_holding(base, KEPT)  # what was kept is still there
    finally:
        await conn.close()
        await store.close()
