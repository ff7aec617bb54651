"""`chatbox workspaces ...`: the operator creates workspaces, manages members, deletes them
(erasing their content), and every change lands in the audit log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chatbox.store import Store
from tests.cli.test_accounts_cli import check, cli, data_dir  # noqa: F401  (a fixture)

ENV = {"CHATBOX_ADMIN_PASSWORD": "adminpw-for-workspaces"}


def test_workspace_lifecycle_from_the_cli(data_dir: Path) -> None:  # noqa: F811
    for name in ("owen", "mia"):
        assert (
            cli(data_dir, "users", "add", name, "--password", f"pw-{name}-1", env=ENV).exit_code
            == 0
        )
    made = cli(data_dir, "workspaces", "create", "Support", "--owner", "owen")
    assert made.exit_code == 0, made.output
    # Bad input: a clear error, nothing made.
    assert cli(data_dir, "workspaces", "create", "Support").exit_code != 0
    assert cli(data_dir, "workspaces", "create", "Other", "--owner", "ghost").exit_code != 0
    assert cli(data_dir, "workspaces", "add-member", "Nope", "mia").exit_code != 0
    added = cli(data_dir, "workspaces", "add-member", "Support", "mia")
    assert added.exit_code == 0, added.output

    listed = json.loads(cli(data_dir, "workspaces", "list", "--json").stdout)
    assert [(w["name"], sorted((m["name"], m["role"]) for m in w["members"])) for w in listed] == [
        ("Support", [("mia", "member"), ("owen", "owner")])
    ]
    table = cli(data_dir, "workspaces", "list").stdout
    assert "Support" in table and "owen" in table and "mia" in table
    ws_id = listed[0]["id"]

    async def seed(store: Store) -> str:
        owen = await store.users.get_by_name("owen")
        assert owen is not None
        conv = await store.conversations.create(owen.id, "Ticket 7")
        assert await store.workspaces.move(owen.id, conv.id, ws_id)
        return conv.id

    conv_id = check(data_dir, seed)

    async def visible(store: Store) -> dict[str, Any]:
        mia = await store.users.get_by_name("mia")
        assert mia is not None
        return {
            "mia sees it": await store.conversations.get(mia.id, str(conv_id)) is not None,
            "role": await store.workspaces.role(ws_id, mia.id),
        }

    assert check(data_dir, visible) == {"mia sees it": True, "role": "member"}
    assert cli(data_dir, "workspaces", "remove-member", "Support", "mia").exit_code == 0
    assert check(data_dir, visible) == {"mia sees it": False, "role": None}
    assert cli(data_dir, "workspaces", "remove-member", "Support", "mia").exit_code != 0

    # Deleting asks first; with --yes it erases the workspace's conversations.
    assert cli(data_dir, "workspaces", "delete", "Support").exit_code != 0
    gone = cli(data_dir, "workspaces", "delete", "Support", "--yes")
    assert gone.exit_code == 0, gone.output
    assert "1 conversations" in gone.stdout

    async def after(store: Store) -> tuple[bool, int]:
        row = await store.db.fetchone(
            "SELECT erased_at, title FROM conversations WHERE id = ?", (conv_id,)
        )
        return row["erased_at"] is not None and row["title"] is None, len(
            await store.workspaces.list()
        )

    assert check(data_dir, after) == (True, 0)
    assert "no workspaces" in cli(data_dir, "workspaces", "list").stdout

    entries = json.loads(cli(data_dir, "audit", "list", "--json").stdout)
    ours = [e for e in reversed(entries) if e["action"].startswith("workspace.")]
    assert [(e["action"], (e["target"] or {}).get("name")) for e in ours] == [
        ("workspace.create", None),
        ("workspace.add_member", "owen"),
        ("workspace.add_member", "mia"),
        ("workspace.remove_member", "mia"),
        ("workspace.delete", None),
    ]
    assert all(e["actor"]["name"].startswith("cli:") for e in ours)
    assert ours[-1]["detail"]["conversations"] == 1
    assert "Ticket 7" not in json.dumps(entries)  # names what changed, never content
