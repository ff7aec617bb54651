"""Files and secrets at rest: the data tree is 0700, the database files 0600, and a generated
admin password never reaches a log stream."""

from __future__ import annotations

import asyncio
import stat
from dataclasses import replace
from pathlib import Path

import pytest
from litestar.testing import TestClient

from chatbox.accounts import ensure_admin
from chatbox.settings import Settings
from chatbox.store import Store
from tests.conftest import test_settings


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.sqlite_only(reason="the modes of the SQLite file and its WAL")
def test_the_data_tree_and_database_are_private(client: TestClient, settings: Settings) -> None:
    assert client.get("/v1/conversations").status_code == 200  # started, and writing
    assert client.post("/v1/conversations", json={}).status_code == 201
    for directory in (settings.data_dir, settings.files_dir, settings.models_path):
        assert mode(directory) == 0o700, directory
    db = settings.db_path
    wal, shm = db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")
    assert wal.exists() and shm.exists()  # WAL mode, open
    for file in (db, wal, shm):
        assert mode(file) == 0o600, file


@pytest.mark.sqlite_only(reason="the mode of an existing SQLite file")
def test_an_existing_world_readable_tree_is_tightened(tmp_path: Path) -> None:
    settings = test_settings(tmp_path / "data")
    settings.files_dir.mkdir(parents=True, mode=0o755)
    settings.data_dir.chmod(0o755)
    settings.db_path.write_bytes(b"")
    settings.db_path.chmod(0o644)

    async def go() -> None:
        settings.ensure_dirs()
        store = await Store.open(settings.db_path)
        await store.close()

    asyncio.run(go())
    assert mode(settings.data_dir) == mode(settings.files_dir) == 0o700
    assert mode(settings.db_path) == 0o600


def _generating(tmp_path: Path) -> Settings:
    """Settings with no admin password given (with_overrides ignores None), so one is made."""
    return replace(test_settings(tmp_path / "data"), admin_password=None)


def _first_start(settings: Settings) -> None:
    async def go() -> None:
        settings.ensure_dirs()
        store = await Store.open(settings.database)
        try:
            await ensure_admin(store, settings)
        finally:
            await store.close()

    asyncio.run(go())


def _logs_in(settings: Settings, password: str) -> bool:
    async def go() -> bool:
        store = await Store.open(settings.database)
        try:
            return await store.users.check_password(settings.admin_name, password) is not None
        finally:
            await store.close()

    return asyncio.run(go())


def test_generated_admin_password_goes_to_a_private_file_off_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = _generating(tmp_path)
    _first_start(settings)
    secret = settings.data_dir / "admin-password.txt"
    assert mode(secret) == 0o600
    password = secret.read_text().strip()
    assert len(password) >= 12 and _logs_in(settings, password)
    out = capsys.readouterr()
    assert password not in out.err and password not in out.out
    assert str(secret) in out.err  # where it is, not what it is


def test_generated_admin_password_is_shown_once_on_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    settings = _generating(tmp_path)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    _first_start(settings)
    err = capsys.readouterr().err
    password = err.split("with password: ", 1)[1].split()[0]
    assert _logs_in(settings, password)
    assert not (settings.data_dir / "admin-password.txt").exists()
    _first_start(settings)  # not again
    assert "password" not in capsys.readouterr().err


def test_a_given_admin_password_is_never_printed_or_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = test_settings(tmp_path / "data", admin_password="given-secret-pass")
    _first_start(settings)
    assert "given-secret-pass" not in capsys.readouterr().err
    assert not (settings.data_dir / "admin-password.txt").exists()
