"""Existing databases upgrade: they record migrations by name, and those names never change."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest

from chatbox.store import Database, migrations, open_database, pg_migrations
from chatbox.store.replicas import ReplicaRepo
from tests.pg import PgServer

# What databases in use have recorded in their `migrations` table, in the order applied.
RECORDED = [
    "0001_initial",
    "0002_accounts",
    "0003_knowledge",
    "0004_turn_routing",
    "0005_audit_log",
    "0006_moderation",
    "0007_data_rules",
    "0008_summaries",
    "0009_replicas",
    "0010_teams",
    "0011_import_staging",
    "0012_audit_refuses_replace",
]


async def _recorded(db: Database) -> list[str]:
    return [r["name"] for r in await db.fetchall("SELECT name FROM migrations ORDER BY rowid")]


async def _schema(db: Database) -> list[tuple[str, str]]:
    rows = await db.fetchall(
        "SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY type, name"
    )
    return [(r["name"], r["sql"]) for r in rows]


def test_the_list_keeps_every_recorded_name_in_its_place() -> None:
    names = [name for name, _ in migrations.MIGRATIONS]
    assert names[: len(RECORDED)] == RECORDED
    assert len(set(names)) == len(names)


@pytest.mark.sqlite_only(reason="SQLite's migrations, read from sqlite_master")
async def test_a_database_migrated_to_the_end_is_recognised(tmp_path: Path) -> None:
    db = await Database.open(tmp_path / "db.sqlite")
    schema = await _schema(db)
    await db.close()
    db = await Database.open(tmp_path / "db.sqlite")  # nothing is applied twice
    assert (await _recorded(db))[: len(RECORDED)] == RECORDED
    assert await _schema(db) == schema
    await db.close()


@pytest.mark.sqlite_only(reason="SQLite's migrations, read from sqlite_master")
@pytest.mark.parametrize("steps", [4, 11])
async def test_an_older_database_gets_exactly_the_steps_it_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, steps: int
) -> None:
    fresh = await Database.open(tmp_path / "fresh.sqlite")
    want = await _schema(fresh)
    await fresh.close()
    every = migrations.MIGRATIONS
    with monkeypatch.context() as m:
        m.setattr(migrations, "MIGRATIONS", every[:steps])
        old = await Database.open(tmp_path / "old.sqlite")
        assert await _recorded(old) == RECORDED[:steps]
        await old.close()
    db = await Database.open(tmp_path / "old.sqlite")
    assert await _recorded(db) == [name for name, _ in every]
    assert await _schema(db) == want
    await db.close()


def test_every_step_has_its_postgresql_script() -> None:
    assert [name for name, _ in migrations.MIGRATIONS] == list(pg_migrations.POSTGRESQL)


@pytest.mark.parametrize("steps", [4, 11])
async def test_an_older_postgresql_database_gets_exactly_the_steps_it_lacks(
    postgres: PgServer, monkeypatch: pytest.MonkeyPatch, steps: int
) -> None:
    fresh = await open_database(postgres.fresh_database())
    want = await fresh.tables()
    await fresh.close()
    url = postgres.url("postgres")
    name = f"old_{steps}"
    conn = await asyncpg.connect(url)
    await conn.execute(f"CREATE DATABASE {name}")
    await conn.close()
    every = migrations.MIGRATIONS
    with monkeypatch.context() as m:
        m.setattr(migrations, "MIGRATIONS", every[:steps])
        old = await open_database(postgres.url(name))
        assert len(await old.fetchall("SELECT name FROM migrations")) == steps
        await old.close()
    db = await open_database(postgres.url(name))
    recorded = await db.fetchall("SELECT name FROM migrations ORDER BY applied_at, name")
    assert [r["name"] for r in recorded] == [n for n, _ in every]
    assert await db.tables() == want
    await db.close()


async def _drained_before_the_drain_table(target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica drained in the table's own column, then the upgrade: it is still drained."""
    every = migrations.MIGRATIONS
    steps = [name for name, _ in every].index("0020_shared_fleet")
    with monkeypatch.context() as m:
        m.setattr(migrations, "MIGRATIONS", every[:steps])
        old = await open_database(target)
        async with old.transaction() as tx:
            for url, draining in (("http://a:9001", 1), ("http://b:9001", 0)):
                await tx.execute(
                    "INSERT INTO replicas (url, kind, draining, added_at) VALUES (?, ?, ?, ?)",
                    (url, "chatbox", draining, 1.0),
                )
        await old.close()
    db = await open_database(target)
    repo = ReplicaRepo(db)
    assert {r.url: r.draining for r in await repo.list()} == {
        "http://a:9001": True,
        "http://b:9001": False,
    }
    assert await repo.drains() == {"http://a:9001"}
    await db.close()


@pytest.mark.sqlite_only(reason="an older SQLite file upgraded")
async def test_a_drained_replica_stays_drained_through_the_upgrade(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _drained_before_the_drain_table(str(tmp_path / "old.sqlite"), monkeypatch)


async def test_a_drained_replica_stays_drained_through_the_postgresql_upgrade(
    postgres: PgServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = await asyncpg.connect(postgres.url("postgres"))
    await conn.execute("CREATE DATABASE old_drains")
    await conn.close()
    await _drained_before_the_drain_table(postgres.url("old_drains"), monkeypatch)
