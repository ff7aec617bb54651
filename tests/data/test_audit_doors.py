"""Admin and owner actions on workspaces and retention are audit-logged by the services,
whichever door they came through: the API here (the console's and the CLI's workspace
doors: tests/web/test_workspace_pages.py, tests/cli/test_workspaces_cli.py)."""

from __future__ import annotations

from chatbox.store import AuditEntry
from tests.cli.test_accounts_cli import cli
from tests.data.conftest import App


def _entries(app: App) -> list[AuditEntry]:
    return list(reversed(app.call(app.services.accounts.audit_log)))


def test_workspace_changes_over_the_api_are_audit_logged(app: App) -> None:
    c = app.client
    made = c.post("/v1/workspaces", json={"name": "Support"}, headers=app.admin)
    assert made.status_code == 201, made.text
    ws = made.json()["id"]
    added = c.post(f"/v1/workspaces/{ws}/members", json={"name": "bob"}, headers=app.admin)
    assert added.status_code == 201, added.text
    bob_id = added.json()["user_id"]
    assert c.delete(f"/v1/workspaces/{ws}/members/{bob_id}", headers=app.admin).status_code == 204
    assert c.delete(f"/v1/workspaces/{ws}", headers=app.admin).status_code == 204

    logged = [
        (e.actor_name, e.action, e.target_name, e.detail.get("workspace"))
        for e in _entries(app)
        if e.action.startswith("workspace.")
    ]
    assert logged == [
        ("admin", "workspace.create", None, ws),
        ("admin", "workspace.add_member", "bob", ws),
        ("admin", "workspace.remove_member", "bob", ws),
        ("admin", "workspace.delete", None, ws),
    ]


def test_retention_runs_from_the_api_and_the_cli_are_audit_logged(app: App) -> None:
    r = app.client.post("/v1/admin/retention/run", params={"dry_run": True}, headers=app.admin)
    assert r.status_code == 200, r.text
    assert app.client.post("/v1/admin/retention/run", headers=app.bob).status_code == 403
    ran = cli(app.settings.data_dir, "retention", "run")
    assert ran.exit_code == 0, ran.output

    logged = [
        (e.actor_name, e.detail["dry_run"]) for e in _entries(app) if e.action == "retention.run"
    ]
    assert len(logged) == 2
    assert logged[0] == ("admin", True)
    assert logged[1][0].startswith("cli:") and logged[1][1] is False
