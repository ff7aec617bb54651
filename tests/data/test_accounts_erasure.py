"""Deleting an account (by an admin over the API or the CLI, or by the user after typing
their name) erases all it owns; usage keeps counts only; admin actions are audit-logged."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.test_accounts_cli import cli
from tests.conftest import ADMIN_PASSWORD, seed_user, test_settings
from tests.data.conftest import App, holding

BOTH_STORES = True  # SQLite and PostgreSQL (tests/conftest.py)

SECRET = "narwhalbanjo5518"


def _fill(app: App, headers: dict[str, str]) -> None:
    c = app.client
    conv = c.post("/v1/conversations", json={"title": SECRET}, headers=headers).json()["id"]
    app.say(conv, f"remember {SECRET}", headers)
    r = c.post(
        "/v1/documents",
        files={"file": ("s.txt", f"The vault word is {SECRET}. " * 30, "text/plain")},
        headers=headers,
    )
    assert r.status_code == 201
    c.patch("/v1/users/me/memory", json={"add": [f"The user says {SECRET}"]}, headers=headers)


def _usage(app: App) -> list[tuple[str, int]]:
    rows = app.call(
        app.services.store.db.fetchall,
        "SELECT user_id, requests FROM usage ORDER BY user_id",
    )
    return [(r[0], int(r[1])) for r in rows]


def test_admin_deletes_an_account_over_the_api(app: App) -> None:
    c = app.client
    _fill(app, app.bob)
    usage_before = _usage(app)
    assert c.delete("/v1/admin/users/bob", headers=app.bob).status_code == 403
    assert c.delete("/v1/admin/users/nobody", headers=app.admin).status_code == 404
    assert c.delete("/v1/admin/users/admin", headers=app.admin).status_code == 422
    assert c.delete("/v1/admin/users/bob", headers=app.admin).status_code == 204

    assert c.get("/v1/conversations", headers=app.bob).status_code == 401  # its key is gone
    app.call(app.services.store.db.checkpoint)
    for needle in (SECRET, SECRET[-9:]):
        assert holding(app, needle) == [], needle
    assert _usage(app) == usage_before  # counts stay (the row is nameless now)
    listed = [u.name for u in app.call(app.services.store.users.list)]
    assert listed == ["admin"]
    entries = app.call(app.services.accounts.audit_log)
    delete = next(e for e in entries if e.action == "user.delete")
    assert delete.actor_name == "admin" and delete.target_name == "bob"
    assert delete.detail["conversations"] == 1 and delete.detail["documents"] == 1
    # The name is free again; the new bob sees nothing of the old one.
    assert c.delete("/v1/admin/users/bob", headers=app.admin).status_code == 404


def test_a_user_deletes_their_own_account_after_typing_its_name(app: App) -> None:
    c = app.client
    _fill(app, app.bob)
    wrong = c.post("/v1/users/me/delete", json={"confirm": "bobb"}, headers=app.bob)
    assert wrong.status_code == 422 and "name" in wrong.text
    assert len(c.get("/v1/conversations", headers=app.bob).json()["data"]) == 1
    assert (
        c.post("/v1/users/me/delete", json={"confirm": "bob"}, headers=app.bob).status_code == 204
    )
    assert c.get("/v1/conversations", headers=app.bob).status_code == 401
    check = app.services.accounts.check_password
    assert app.call(check, "bob", "bob-pw-123456") is None  # no login either
    app.call(app.services.store.db.checkpoint)
    assert holding(app, SECRET) == []
    entries = app.call(app.services.accounts.audit_log)
    assert next(e for e in entries if e.action == "user.delete").detail["self_service"] is True


def test_admin_export_and_delete_from_the_cli(tmp_path: Path, registry: object) -> None:
    data_dir = tmp_path / "data"
    settings = test_settings(data_dir)
    seed_user(settings, "carl", role="member", tier="free")
    env = {"CHATBOX_ADMIN_PASSWORD": ADMIN_PASSWORD}
    out = tmp_path / "carl.zip"
    r = cli(data_dir, "users", "export", "carl", "-o", str(out), env=env)
    assert r.exit_code == 0, r.output
    assert out.stat().st_mode & 0o777 == 0o600
    r = cli(data_dir, "users", "delete", "carl", "--yes", env=env)
    assert r.exit_code == 0 and "Erased 'carl'" in r.output, r.output
    assert cli(data_dir, "users", "delete", "carl", "--yes", env=env).exit_code != 0
    entries = json.loads(cli(data_dir, "audit", "list", "--json", env=env).stdout)
    actions = [(e["action"], e["target"]["name"]) for e in entries if e["target"]]
    assert ("user.export", "carl") in actions and ("user.delete", "carl") in actions
    assert all(e["actor"]["name"].startswith("cli:") for e in entries[:2])
    dry = cli(data_dir, "retention", "run", "--dry-run", "--json", env=env)
    assert dry.exit_code == 0 and json.loads(dry.stdout)["dry_run"] is True
    assert cli(data_dir, "users", "set-retention", "admin", "none", env=env).exit_code == 0
