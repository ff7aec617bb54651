"""The audit log is append-only: the repository cannot change it, and neither can SQL."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatbox.accounts import AuditLog, UserAdmin
from chatbox.store import Store
from chatbox.store.audit import AuditRepo

BOTH_STORES = True  # SQLite and PostgreSQL (tests/conftest.py)


def test_the_repo_offers_no_way_to_change_or_remove_an_entry() -> None:
    public = {n for n in dir(AuditRepo) if not n.startswith("_")}
    assert public == {"append", "list"}


async def test_triggers_refuse_update_and_delete(database: Path | str) -> None:
    store = await Store.open(database)
    sqlite = store.db.dialect == "sqlite"
    try:
        if sqlite:
            triggers = {
                r["name"]: r["sql"]
                for r in await store.db.fetchall(
                    "SELECT name, sql FROM sqlite_master WHERE type = 'trigger'"
                    " AND tbl_name = 'audit_log'"
                )
            }
            assert set(triggers) == {
                "audit_log_no_update",
                "audit_log_no_delete",
                "audit_log_no_replace",
            }
            assert "BEFORE UPDATE" in triggers["audit_log_no_update"]
            assert "BEFORE DELETE" in triggers["audit_log_no_delete"]
        user = await store.users.create("ann")
        entry = await AuditLog(store).record(
            "cli:test", "user.set_tier", user, before="free", after="paid"
        )
        for sql in (
            "UPDATE audit_log SET action = 'nothing' WHERE id = ?",
            "UPDATE audit_log SET detail = '{}'",
            "DELETE FROM audit_log WHERE id = ?",
            "DELETE FROM audit_log",
            # REPLACE deletes the row it collides with without firing the delete trigger.
            *(
                (
                    "INSERT OR REPLACE INTO audit_log (id, at, actor_name, action)"
                    " VALUES (?, 0, 'x', 'y')",
                    "REPLACE INTO audit_log (id, at, actor_name, action) VALUES (?, 0, 'x', 'y')",
                )
                if sqlite
                else (
                    "INSERT INTO audit_log (id, at, actor_name, action) VALUES (?, 0, 'x', 'y')"
                    " ON CONFLICT (id) DO UPDATE SET action = 'y'",
                    "TRUNCATE audit_log",
                )
            ),
        ):
            with pytest.raises(Exception, match="append-only"):
                async with store.db.transaction() as tx:
                    await tx.execute(sql, (entry.id,) if "?" in sql else ())
        (kept,) = await store.audit.list()
        assert kept == entry and kept.detail == {"before": "free", "after": "paid"}
        assert (kept.actor_id, kept.actor_name) == (None, "cli:test")
        assert (kept.target_id, kept.target_name) == (user.id, "ann")
    finally:
        await store.close()


async def test_entries_filter_and_refuse_content(database: Path | str) -> None:
    store = await Store.open(database)
    try:
        admin = await store.users.create("root", role="admin")
        ann = await store.users.create("ann")
        bob = await store.users.create("bob")
        actions = UserAdmin(store, admin)
        await actions.set_tier(ann, "paid")
        await actions.set_disabled(bob, True)
        await actions.set_role(ann, "admin")
        log = AuditLog(store)
        assert [e.action for e in await log.entries()] == [
            "user.set_role",
            "user.disable",
            "user.set_tier",
        ]
        assert [e.action for e in await log.entries(target=ann)] == [
            "user.set_role",
            "user.set_tier",
        ]
        assert [e.target_name for e in await log.entries(action="user.disable")] == ["bob"]
        assert len(await log.entries(1)) == 1
        assert {(e.actor_id, e.actor_name) for e in await log.entries()} == {(admin.id, "root")}
        for field in ("password", "content", "text", "secret"):
            with pytest.raises(ValueError, match="content or secrets"):
                await log.record(admin, "user.reset_password", ann, **{field: "x"})
        assert len(await log.entries()) == 3
    finally:
        await store.close()
