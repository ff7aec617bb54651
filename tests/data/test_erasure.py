"""Deleting a conversation erases it: no file in the data directory holds its words after,
what was kept stays (and stays append-only), and a content-free tombstone is left."""

from __future__ import annotations

import time

import pytest

from tests.data.conftest import App, holding

BOTH_STORES = True  # SQLite and PostgreSQL (tests/conftest.py)

SECRET = "quokkasaurus7731"  # a word no model or fixture would write by chance
KEPT = "marmalade4412"


def _conversation_with_everything(app: App, secret: str) -> tuple[str, str]:
    """A conversation holding `secret` in every place content goes: a turn (and its FTS
    row and vector), an attached document (chunks, FTS, vectors), an extracted fact."""
    c = app.client
    conv = c.post("/v1/conversations", json={"title": f"about {secret}"}, headers=app.admin)
    conv_id = conv.json()["id"]
    doc = c.post(
        f"/v1/conversations/{conv_id}/documents",
        files={"file": ("locker.txt", f"The locker code is {secret}. " * 40, "text/plain")},
        headers=app.admin,
    )
    assert doc.status_code == 201, doc.text
    assert "done" in app.say(conv_id, f"My locker code is {secret}, remember it", app.admin)
    services = app.services
    admin = app.call(services.store.users.get_by_name, "admin")

    async def extracted() -> None:
        await services.knowledge.memory.add(
            admin.id, [f"The user's locker code is {secret}"], "extracted", conv_id
        )

    app.call(extracted)
    # Searching indexes the turns' vectors behind it (and loads the in-RAM index).
    hits = c.get("/v1/search", params={"q": secret}, headers=app.admin).json()["data"]
    assert {h["conversation_id"] for h in hits} == {conv_id}
    deadline = time.monotonic() + 60
    while app.call(services.store.search.unindexed, admin.id, 1):
        assert time.monotonic() < deadline, "the turns were not indexed"
        time.sleep(0.1)
    # Again, now that no vector is being written: a load that a write crossed is dropped
    # (knowledge/vector_index.py), so the first search may have left the index unloaded.
    c.get("/v1/search", params={"q": secret}, headers=app.admin)
    return conv_id, admin.id


def test_deleted_conversation_leaves_no_trace_in_any_file(app: App) -> None:
    c = app.client
    conv_id, admin_id = _conversation_with_everything(app, SECRET)
    kept = c.post("/v1/conversations", json={}, headers=app.admin).json()["id"]
    app.say(kept, f"The garden shed code is {KEPT}", app.admin)
    c.patch("/v1/users/me/memory", json={"add": [f"The user likes {KEPT} jam"]}, headers=app.admin)
    store = app.services.store
    app.call(store.db.checkpoint)
    assert holding(app, SECRET), "the test needs a trace first"

    assert c.delete(f"/v1/conversations/{conv_id}", headers=app.admin).status_code == 204

    app.call(store.db.checkpoint)
    for needle in (SECRET, SECRET[-9:], SECRET[:9]):  # FTS keeps terms prefix-compressed
        assert holding(app, needle) == [], needle
    assert c.get(f"/v1/conversations/{conv_id}", headers=app.admin).status_code == 404
    # By its words (by meaning below: a random tiny-model answer in the kept conversation
    # once came within the meaning threshold of this query, and was the only hit)
    words = {"q": SECRET, "mode": "words"}
    assert c.get("/v1/search", params=words, headers=app.admin).json()["data"] == []
    meaning = c.get(
        "/v1/search", params={"q": "locker code", "mode": "meaning"}, headers=app.admin
    ).json()["data"]
    assert conv_id not in {h["conversation_id"] for h in meaning}
    assert c.get("/v1/documents", headers=app.admin).json()["data"] == []
    facts = [f["text"] for f in c.get("/v1/users/me/memory", headers=app.admin).json()["data"]]
    assert facts and all(SECRET not in f for f in facts) and any(KEPT in f for f in facts)
    # What was kept is still there, still found.
    assert holding(app, KEPT)
    found = c.get("/v1/search", params={"q": KEPT}, headers=app.admin).json()["data"]
    assert {h["conversation_id"] for h in found} == {kept}

    db = store.db
    tomb = app.call(
        db.fetchone,
        "SELECT user_id, title, system_prompt, erased_at FROM conversations WHERE id = ?",
        (conv_id,),
    )
    assert tomb[0] == admin_id and tomb[1] is None and tomb[2] is None and tomb[3]
    for table in ("turns", "drafts"):
        n = app.call(
            db.fetchone, f"SELECT count(*) FROM {table} WHERE conversation_id = ?", (conv_id,)
        )
        assert n[0] == 0

    # Append-only still holds for kept turns: neither rewritten nor removed.
    async def change(sql: str) -> None:
        async with db.transaction() as tx:
            await tx.execute(sql, (kept,))

    for sql in (
        "UPDATE turns SET content = 'x' WHERE conversation_id = ?",
        "DELETE FROM turns WHERE conversation_id = ?",
    ):
        with pytest.raises(Exception, match="append-only"):
            app.call(change, sql)


def test_vectors_leave_the_database_and_the_in_ram_index(app: App) -> None:
    conv_id, admin_id = _conversation_with_everything(app, SECRET)
    store, index = app.services.store, app.services.knowledge.index
    before = {t: app.call(store.vectors.count, t, admin_id) for t in ("turn_vec", "chunk_vec")}
    assert before["turn_vec"] >= 2 and before["chunk_vec"] >= 1
    assert index.loaded("turn_vec", admin_id)
    app.client.delete(f"/v1/conversations/{conv_id}", headers=app.admin)
    for table in ("turn_vec", "chunk_vec", "memory_vec"):
        assert app.call(store.vectors.count, table, admin_id) == 0, table
    # The in-RAM copy followed the deletion: a query finds nothing of it.
    vector = app.call(app.services.knowledge.embedder.embed_one, SECRET)
    assert app.call(index.nearest, "turn_vec", admin_id, vector, 5) in ([], None)


def test_others_cannot_delete_and_a_late_fact_is_refused(app: App) -> None:
    c = app.client
    conv_id = c.post("/v1/conversations", json={}, headers=app.admin).json()["id"]
    app.say(conv_id, "hello there", app.admin)
    assert c.delete(f"/v1/conversations/{conv_id}", headers=app.bob).status_code == 404
    assert c.get(f"/v1/conversations/{conv_id}", headers=app.admin).status_code == 200
    assert c.delete(f"/v1/conversations/{conv_id}", headers=app.admin).status_code == 204
    assert c.delete(f"/v1/conversations/{conv_id}", headers=app.admin).status_code == 404
    admin = app.call(app.services.store.users.get_by_name, "admin")

    async def late_fact() -> None:  # an extraction that finishes after the deletion
        await app.services.knowledge.memory.add(
            admin.id, ["The user owns a red kayak"], "extracted", conv_id
        )

    with pytest.raises(Exception, match="deleted"):
        app.call(late_fact)
    assert app.call(app.services.store.memories.count, admin.id) == 0
