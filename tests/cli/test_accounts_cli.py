"""`chatbox users …`, `chatbox keys …` and `chatbox usage`, through click's CliRunner."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from chatbox.cli import main
from chatbox.store import Store
from tests.conftest import store_env, store_for


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("CHATBOX_DATA_DIR", "CHATBOX_ADMIN_PASSWORD", "CHATBOX_POLICY_PATH"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path / "data"


def cli(data_dir: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    every = {**store_env(data_dir), **(env or {})}
    return CliRunner().invoke(main, ["--data-dir", str(data_dir), *args], env=every)


def check(data_dir: Path, coro_fn: object) -> object:
    async def run() -> object:
        store = await Store.open(store_for(data_dir))
        try:
            return await coro_fn(store)  # type: ignore[operator]
        finally:
            await store.close()

    return asyncio.run(run())


def test_scripted_setup_seeds_the_admin_and_prints_only_a_key(data_dir: Path) -> None:
    result = cli(
        data_dir, "keys", "create", "--user", "admin", env={"CHATBOX_ADMIN_PASSWORD": "s3cret-pass"}
    )
    assert result.exit_code == 0, result.output
    key = result.stdout.strip()
    assert key.startswith("cbx-") and "\n" not in key
    assert "s3cret-pass" not in result.output

    async def verify(store: Store) -> None:
        admin = await store.users.check_password("admin", "s3cret-pass")
        assert admin is not None and admin.role == "admin"
        user = await store.keys.authenticate(key)
        assert user is not None and user.name == "admin"

    check(data_dir, verify)


def test_first_use_without_a_password_generates_one_into_a_private_file(data_dir: Path) -> None:
    # CliRunner's stderr is no terminal: the password goes to a 0600 file, never the stream.
    result = cli(data_dir, "users", "list")
    assert result.exit_code == 0
    secret = data_dir / "admin-password.txt"
    password = secret.read_text().strip()
    assert secret.stat().st_mode & 0o777 == 0o600
    assert "log in at" in result.stderr and str(secret) in result.stderr
    assert password not in result.output
    assert "admin" in result.stdout
    assert check(data_dir, lambda s: s.users.check_password("admin", password)) is not None
    assert "password" not in cli(data_dir, "users", "list").stderr  # only the first time


def test_users_lifecycle(data_dir: Path) -> None:
    env = {"CHATBOX_ADMIN_PASSWORD": "adminpw"}
    assert cli(data_dir, "users", "add", "ann", "--password", "pw1", env=env).exit_code == 0
    assert cli(data_dir, "users", "add", "ann", "--password", "x").exit_code != 0  # taken
    bad = cli(data_dir, "users", "add", "zed", "--tier", "gold", "--password", "x")
    assert bad.exit_code != 0 and "unknown tier" in bad.output
    assert cli(data_dir, "users", "set-tier", "ann", "paid").exit_code == 0
    assert cli(data_dir, "users", "set-role", "ann", "admin").exit_code == 0
    listed = json.loads(cli(data_dir, "users", "list", "--json").stdout)
    ann = next(u for u in listed if u["name"] == "ann")
    assert ann == {"name": "ann", "role": "admin", "tier": "paid", "disabled": False}
    reset = cli(data_dir, "users", "reset-password", "ann")
    assert reset.exit_code == 0 and "New password set for ann: " in reset.output
    new_password = reset.output.strip().rsplit(": ", 1)[1]

    async def login(store: Store) -> tuple[bool, bool]:
        return (
            await store.users.check_password("ann", "pw1") is not None,
            await store.users.check_password("ann", new_password) is not None,
        )

    assert check(data_dir, login) == (False, True)
    key = cli(data_dir, "keys", "create", "--user", "ann", "--name", "ci").stdout.strip()
    assert cli(data_dir, "users", "disable", "ann").exit_code == 0
    assert check(data_dir, lambda s: s.keys.authenticate(key)) is None
    assert check(data_dir, login) == (False, False)
    assert cli(data_dir, "users", "enable", "ann").exit_code == 0
    assert check(data_dir, lambda s: s.keys.authenticate(key)) is not None
    assert cli(data_dir, "users", "disable", "nobody").exit_code != 0


def test_users_add_with_key_prints_a_key_that_acts_as_the_new_user(data_dir: Path) -> None:
    made = cli(data_dir, "users", "add", "bo", "--no-password", "--key")
    assert made.exit_code == 0, made.output
    key = made.stdout.strip()
    user = check(data_dir, lambda s: s.keys.authenticate(key))
    assert user is not None and user.name == "bo"
    assert "cbx-" not in made.stderr  # the key is on stdout alone, for a script to read
    listing = cli(data_dir, "keys", "list", "--user", "bo").stdout
    assert key[:10] in listing and key not in listing


def test_keys_list_and_revoke(data_dir: Path) -> None:
    key = cli(data_dir, "keys", "create", "--user", "admin", "--name", "laptop").stdout.strip()
    listing = cli(data_dir, "keys", "list").stdout
    assert "laptop" in listing and key[:10] in listing and key not in listing
    key_id = listing.splitlines()[1].split()[0]
    assert cli(data_dir, "keys", "revoke", key_id).exit_code == 0
    assert "revoked" in cli(data_dir, "keys", "list", "--user", "admin").stdout
    assert check(data_dir, lambda s: s.keys.authenticate(key)) is None
    assert cli(data_dir, "keys", "revoke", key_id).exit_code != 0
    assert cli(data_dir, "keys", "create", "--user", "ghost").exit_code != 0


def test_usage_report(data_dir: Path) -> None:
    cli(data_dir, "users", "list")

    async def record(store: Store) -> None:
        admin = await store.users.get_by_name("admin")
        assert admin is not None
        await store.usage.record(admin.id, "smollm2", prompt=10, completion=5)
        await store.usage.record(admin.id, "smollm2", requests=0, shed=1)

    check(data_dir, record)
    table = cli(data_dir, "usage").stdout
    assert "admin" in table and "smollm2" in table
    report = json.loads(cli(data_dir, "usage", "--json").stdout)
    (row,) = report["data"]
    assert (row["requests"], row["total_tokens"], row["shed"]) == (1, 15, 1)
