"""The suite's one store switch (CHATBOX_TEST_STORE): every way a test gets a store follows it,
and on the PostgreSQL pass a SQLite store opened outside it is caught."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from chatbox.store import Store
from tests import conftest
from tests.conftest import TEST_STORE, store_env, store_for, test_settings


def _on_switch(database: Path | str) -> bool:
    if TEST_STORE == "postgresql":
        return isinstance(database, str) and database.startswith("postgresql://")
    return isinstance(database, Path) and database.suffix == ".db"


def test_settings_and_the_database_fixture_follow_the_switch(
    tmp_path: Path, database: Path | str
) -> None:
    settings = test_settings(tmp_path / "data")
    assert _on_switch(settings.database), settings.database
    assert _on_switch(database), database
    again = test_settings(tmp_path / "data", max_tokens=8)  # the same box, opened again
    assert again.database == settings.database
    assert test_settings(tmp_path / "other").database != settings.database


def test_a_served_box_and_the_cli_get_the_same_store(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    url = store_env(data_dir).get("CHATBOX_DATABASE_URL")
    if TEST_STORE == "postgresql":
        assert url == store_for(data_dir) == test_settings(data_dir).database
    else:
        assert url is None and store_for(data_dir) == data_dir / "chatbox.db"


def test_settings_can_still_name_sqlite_for_a_test_about_it(tmp_path: Path) -> None:
    settings = test_settings(tmp_path / "data", database_url=None)
    assert settings.database == settings.db_path


@pytest.mark.skipif(TEST_STORE != "postgresql", reason="the guard watches the PostgreSQL pass")
def test_a_sqlite_store_opened_on_the_postgresql_pass_is_caught(tmp_path: Path) -> None:
    async def open_one() -> None:
        store = await Store.open(tmp_path / "outside.db")
        await store.close()

    asyncio.run(open_one())
    caught, conftest._OPENED[:] = list(conftest._OPENED), []  # so that this test passes
    assert caught == [tmp_path / "outside.db"]
