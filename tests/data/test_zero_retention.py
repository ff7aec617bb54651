"""Zero-data-retention (per request, key, user and tier): the answer streams and usage is
counted, and no other row is written (every table's rows are counted before and after)."""

from __future__ import annotations

from pathlib import Path

from chatbox.catalog.registry import ModelRegistry
from chatbox.chat.policy import default_policy_path
from chatbox.data.retention import SWEEP_JOB
from chatbox.settings import Settings
from tests.data.conftest import App, holding
from tests.sse import parse_sse

BOTH_STORES = True  # SQLite and PostgreSQL (tests/conftest.py)

SECRET = "pelicanfjord9"
NONE = {"X-Chatbox-Retention": "none"}


def row_counts(app: App) -> dict[str, int]:
    """Rows in every table of the database (virtual tables' shadow tables included), read
    on the app's own connection (a second SQLite library in one process would break its
    locks)."""
    db = app.services.store.db
    out = {}
    for name in app.call(db.tables):
        out[name] = app.call(db.fetchone, f'SELECT count(*) FROM "{name}"')[0]
    return out


def usage_requests(app: App) -> int:
    db = app.services.store.db
    return int(app.call(db.fetchone, "SELECT coalesce(sum(requests), 0) FROM usage")[0])


def _events(response) -> list[str]:  # type: ignore[no-untyped-def]
    assert response.status_code == 200, response.text
    return [e.event for e in parse_sse(iter(response.text.split("\n")))]


def _nothing_written(app: App, before: dict[str, int], requests_before: int, n: int) -> None:
    after = row_counts(app)
    changed = {t: (before[t], after.get(t)) for t in before if before[t] != after.get(t)}
    # Usage is counted (per person, and per model and hour), and on PostgreSQL the shared
    # limits keep their levels (numbers per user, no content). Output moderation may queue
    # the (random) answer of the tiny model for review: under zero-data-retention such an
    # item keeps scores, never text.
    counted = {"usage", "usage_hours", "limit_buckets", "limit_leases", "limit_failures"}
    assert set(changed) <= counted | {"moderation_items", "job_claims"}, changed
    if "job_claims" in changed:  # the retention sweep's lease, taken 5 s after the start
        jobs = app.call(app.services.store.db.fetchall, "SELECT name FROM job_claims")
        assert {name for (name,) in jobs} <= {SWEEP_JOB}, jobs
    new_items = after.get("moderation_items", 0) - before.get("moderation_items", 0)
    if new_items:
        rows = app.call(
            app.services.store.db.fetchall,
            f"SELECT text FROM moderation_items ORDER BY created_at DESC LIMIT {new_items}",
        )
        assert [text for (text,) in rows] == [None] * new_items
    assert usage_requests(app) == requests_before + n
    app.call(app.services.store.db.checkpoint)
    assert holding(app, SECRET) == []


def test_temporary_chat_by_header_stores_nothing(app: App) -> None:
    c = app.client
    before, requests = row_counts(app), usage_requests(app)
    made = c.post("/v1/conversations", json={}, headers={**app.admin, **NONE})
    assert made.status_code == 201 and made.json()["temporary"] is True
    tmp = made.json()["id"]
    for text in (f"My code word is {SECRET}", "and what else?"):
        r = c.post(f"/v1/conversations/{tmp}/turns", json={"content": text}, headers=app.admin)
        assert _events(r)[-1] == "done"
    shown = c.get(f"/v1/conversations/{tmp}", headers=app.admin).json()
    assert [m["role"] for m in shown["messages"]] == ["user", "assistant"] * 2
    assert SECRET in shown["messages"][0]["content"]
    assert c.get(f"/v1/conversations/{tmp}", headers=app.bob).status_code == 404
    assert c.get("/v1/conversations", headers=app.admin).json()["data"] == []
    _nothing_written(app, before, requests, 2)
    assert c.delete(f"/v1/conversations/{tmp}", headers=app.admin).status_code == 204
    assert c.get(f"/v1/conversations/{tmp}", headers=app.admin).status_code == 404


def test_a_request_in_a_stored_conversation_is_answered_not_written(app: App) -> None:
    c = app.client
    conv = c.post("/v1/conversations", json={}, headers=app.admin).json()["id"]
    app.say(conv, "hello, this is kept", app.admin)
    before, requests = row_counts(app), usage_requests(app)
    r = c.post(
        f"/v1/conversations/{conv}/turns",
        json={"content": f"off the record: {SECRET}"},
        headers={**app.admin, **NONE},
    )
    assert _events(r)[-1] == "done"
    _nothing_written(app, before, requests, 1)
    turns = c.get(f"/v1/conversations/{conv}", headers=app.admin).json()["turns"]
    assert len(turns) == 2 and all(SECRET not in t["content"] for t in turns)
    regen = c.post(
        f"/v1/conversations/{conv}/turns/{turns[-1]['id']}/regenerate",
        headers={**app.admin, **NONE},
    )
    assert regen.status_code == 422 and "zero-data-retention" in regen.text
    bad = c.post("/v1/conversations", json={}, headers={**app.admin, "X-Chatbox-Retention": "x"})
    assert bad.status_code == 422


def test_zero_retention_for_a_user_and_for_a_key(app: App) -> None:
    c = app.client
    me = c.patch("/v1/users/me/retention", json={"zero_retention": True}, headers=app.bob)
    assert me.status_code == 200 and me.json()["zero_retention"] is True
    before, requests = row_counts(app), usage_requests(app)
    made = c.post("/v1/conversations", json={}, headers=app.bob).json()
    assert made["temporary"] is True
    r = c.post(f"/v1/conversations/{made['id']}/turns", json={"content": SECRET}, headers=app.bob)
    assert _events(r)[-1] == "done"
    _nothing_written(app, before, requests, 1)
    # The admin's key, switched to zero-data-retention: its requests store nothing either.
    key = app.admin["Authorization"].split()[1]
    transfer = app.services.data.transfer  # type: ignore[union-attr]
    store = app.services.store
    admin = app.call(store.users.get_by_name, "admin")
    key_id = app.call(store.keys.list, admin.id)[0].id
    assert app.call(transfer.set_key_zero_retention, key_id, True)
    assert app.call(transfer.key_zero_retention, key)
    assert c.post("/v1/conversations", json={}, headers=app.admin).json()["temporary"] is True


def test_zero_retention_for_a_tier(
    tmp_path: Path, settings: Settings, registry: ModelRegistry, embedder: object
) -> None:
    from litestar.testing import TestClient

    from chatbox.app import create_app
    from tests.conftest import bearer, seed_user

    policy = tmp_path / "policy.toml"
    policy.write_text(
        default_policy_path()
        .read_text()
        .replace("retention_days = 0", "retention_days = 0\nzero_retention = true")
    )
    settings = settings.with_overrides(policy_path=policy)
    bob = bearer(seed_user(settings, "bob", role="member", tier="free"))
    with TestClient(create_app(settings, registry), timeout=120) as c:
        app = App(c, {}, bob, settings)
        before, requests = row_counts(app), usage_requests(app)
        made = c.post("/v1/conversations", json={}, headers=bob).json()
        assert made["temporary"] is True
        r = c.post(f"/v1/conversations/{made['id']}/turns", json={"content": SECRET}, headers=bob)
        assert _events(r)[-1] == "done"
        _nothing_written(app, before, requests, 1)
        keeps = c.get("/v1/users/me/retention", headers=bob).json()["keeps"]
        assert "temporary" in keeps
