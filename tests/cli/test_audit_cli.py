"""Admin actions from the CLI land in the audit log, and `chatbox audit list` shows them."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.test_accounts_cli import check, cli, data_dir  # noqa: F401  (a fixture)

ENV = {"CHATBOX_ADMIN_PASSWORD": "adminpw-for-audit"}


def test_cli_account_changes_are_audited(data_dir: Path) -> None:  # noqa: F811
    assert cli(data_dir, "users", "add", "ann", "--password", "pw-ann-1", env=ENV).exit_code == 0
    for args in (
        ("users", "set-tier", "ann", "paid"),
        ("users", "set-role", "ann", "admin"),
        ("users", "disable", "ann"),
        ("users", "enable", "ann"),
        ("users", "reset-password", "ann", "--password", "pw-ann-2"),
    ):
        assert cli(data_dir, *args).exit_code == 0, args
    key = cli(data_dir, "keys", "create", "--user", "ann", "--name", "ci").stdout.strip()
    key_id = cli(data_dir, "keys", "list", "--user", "ann").stdout.splitlines()[1].split()[0]
    assert cli(data_dir, "keys", "revoke", key_id).exit_code == 0
    assert cli(data_dir, "users", "list").exit_code == 0  # reading is not audited

    listed = cli(data_dir, "audit", "list", "--json")
    assert listed.exit_code == 0, listed.output
    entries = json.loads(listed.stdout)
    assert [e["action"] for e in reversed(entries)] == [
        "user.add",  # the first admin, seeded by chatbox itself
        "user.add",
        "user.set_tier",
        "user.set_role",
        "user.disable",
        "user.enable",
        "user.reset_password",
        "key.create",
        "key.revoke",
    ]
    first, *ours = reversed(entries)
    assert first["actor"] == {"id": None, "name": "chatbox"}
    assert first["target"]["name"] == "admin" and first["detail"]["first_start"] is True
    assert all(e["actor"]["name"].startswith("cli:") and e["actor"]["id"] is None for e in ours)
    assert all(e["target"]["name"] == "ann" and e["target"]["id"].startswith("u_") for e in ours)
    by_action = {e["action"]: e for e in ours}
    assert by_action["user.set_role"]["detail"] == {"before": "member", "after": "admin"}
    assert by_action["key.revoke"]["detail"]["key_id"] == key_id
    # No secret or content in the log: not the passwords, not the key.
    for secret in ("pw-ann-1", "pw-ann-2", "adminpw-for-audit", key):
        assert secret not in listed.stdout

    newest = json.loads(cli(data_dir, "audit", "list", "--json", "--limit", "2").stdout)
    assert [e["action"] for e in newest] == ["key.revoke", "key.create"]
    table = cli(data_dir, "audit", "list", "--user", "ann", "--action", "user.disable")
    assert table.exit_code == 0
    assert len(table.stdout.splitlines()) == 2 and "user.disable" in table.stdout
    assert cli(data_dir, "audit", "list", "--user", "ghost").exit_code != 0


def test_audit_list_loads_no_web_app(data_dir: Path) -> None:  # noqa: F811
    from tests.cli.test_startup import HEAVY, loaded_by

    modules = loaded_by("audit", "list", data_dir=data_dir)
    assert "chatbox.store" in modules
    assert not [m for m in HEAVY if m in modules]
