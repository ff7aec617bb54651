"""The content registry (chatbox/store/content.py) declares every table and text column, and
erasing an account takes its rows from every table the registry says that erasure reaches."""

from __future__ import annotations

import io
import time
import zipfile
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from chatbox.store import Store, content
from chatbox.store.shares import SharedPassage, SharedTurn
from tests.data.conftest import App, holding

BOTH_STORES = True  # SQLite and PostgreSQL (tests/conftest.py)

SECRET = "zebrafjord9931"  # in every content column of the account's rows
NUMERIC = ("INT", "REAL", "FLOA", "DOUB", "NUM")  # affinities that hold no text in our code


def _holds_text(declared: str) -> bool:
    """A column that can hold text or bytes: TEXT/BLOB/ANY affinity, or untyped (virtual)."""
    kind = declared.upper()
    return not any(n in kind for n in NUMERIC)


async def _schema(store: Store) -> dict[str, tuple[str, list[str], list[str]]]:
    """Every table after all migrations: (its CREATE statement on SQLite, its text-holding
    columns (PostgreSQL's tsvector and bytea hold text too), all its columns)."""
    out = {}
    for name, cols in (await store.db.tables()).items():
        sql = ""
        if store.db.dialect == "sqlite":
            row = await store.db.fetchone("SELECT sql FROM sqlite_master WHERE name = ?", (name,))
            sql = row["sql"] or ""
        out[name] = (sql, [c for c, kind in cols if _holds_text(kind)], [c for c, _ in cols])
    return out


async def test_every_table_and_text_column_is_declared(database: Path | str) -> None:
    store = await Store.open(database)
    sqlite = store.db.dialect == "sqlite"
    try:
        schema = await _schema(store)
    finally:
        await store.close()
    undeclared = []
    for name, (sql, text, every) in schema.items():
        if name not in content.BY_NAME:
            owner = content.shadow_of(name)
            assert owner is not None and owner.name in schema, f"table {name} is not declared"
            continue  # an FTS5/vec0 table's storage: declared by its virtual table
        t = content.table(name)
        using = sql.upper().split("USING ")[-1] if "VIRTUAL" in sql.upper() else None
        if sqlite:  # PostgreSQL keeps FTS and vectors in plain tables of the same names
            assert (t.virtual or None) == (using.split("(")[0].strip().lower() if using else None)
        undeclared += [f"{name}.{c}" for c in text if c not in t.content and c not in t.plain]
        # A vector table's rowid is an untyped (text-holding) column of vec0, a bigint here.
        stale = [c for c in (*t.content, *t.plain) if c not in (text if sqlite else every)]
        assert not stale, f"{name}: declared columns not in the schema: {stale}"
        assert t.content or t.why, f"{name} holds no content: say what it is (why)"
        assert t.scope is not None or not t.erase, f"{name}: nobody's rows, yet erased"
    assert undeclared == [], "text columns neither content nor plain (with a reason)"
    assert set(content.BY_NAME) <= set(schema), "declared tables that do not exist"


def _reach(kind: content.Kind) -> set[content.Kind]:
    """The erasures one of `kind` runs (itself and its parts, transitively)."""
    out = {kind}
    for part, _ in content.PARTS.get(kind, ()):
        out |= _reach(part)
    return out


def test_every_content_table_is_reached_by_an_erasure() -> None:
    for t in content.TABLES:
        for kind, act in t.erase.items():
            if isinstance(act, content.WithParent):  # the parent must really take them
                parent = content.table(act.parent).erase.get(kind)
                assert parent is not None and not isinstance(parent, content.WithParent), t.name
        if not t.content:
            continue
        owner: content.Kind = "workspace" if t.scope == "workspace" else "account"
        assert set(t.erase) & _reach(owner), f"{t.name}: no {owner} erasure takes its content"


# Rows of the account in the tables that hold none of its words (the key: the table's name).
OWNED = {
    "turn_citations": "turn_id IN (SELECT t.id FROM turns t JOIN conversations c"
    " ON c.id = t.conversation_id WHERE c.user_id = :user)",
    "memory_extractions": "conversation_id IN (SELECT id FROM conversations WHERE user_id = :user)",
    "workspace_members": "user_id = :user",
    "turn_vec_progress": "user_id = :user",
    "sessions": "user_id = :user",
    "api_keys": "user_id = :user",
}
WORDS = {"users": "bob"}  # the account's name; every other table holds SECRET


async def _left(
    store: Store, t: content.Table, user_id: str, secret: str = SECRET, words: Any = WORDS
) -> int:
    """How many rows of the owner (`user_id`: its vectors' partition) or holding its words
    (`secret`; `words`: another word for some tables) `t` has."""
    params: dict[str, Any] = {"user": user_id, "word": f"%{words.get(t.name, secret)}%"}
    postgresql = store.db.dialect == "postgresql"
    if t.virtual == "vec0":
        sql = f"SELECT count(*) FROM {t.name} WHERE user_id = :user"
    elif t.virtual == "fts5" and postgresql:  # a tsvector's lexemes, as text
        sql = f"SELECT count(*) FROM {t.name} WHERE {t.content[0]}::text LIKE :word"
        params = {"word": f"%{secret}%"}
    elif t.virtual == "fts5":
        sql = f"SELECT count(*) FROM {t.name} WHERE {t.name} MATCH :match"
        params = {"match": f'"{secret}"'}
    elif t.content:
        sql = f"SELECT count(*) FROM {t.name} WHERE " + " OR ".join(
            f"{c} LIKE :word" for c in t.content
        )
    else:
        sql = f"SELECT count(*) FROM {t.name} WHERE {OWNED[t.name]}"
    async with (
        store.db.reading() as tx,
        tx.execute(sql, {k: v for k, v in params.items() if f":{k}" in sql}) as cur,
    ):
        row = await cur.fetchone()
    return int(row[0]) if row else 0


def _fill(app: App) -> str:
    """Give bob a row in every table an account's erasure reaches: through the API where
    it can, through the store for what a test cannot make happen on the tiny model."""
    c, bob = app.client, app.bob
    conv = c.post(
        "/v1/conversations", json={"title": SECRET, "system_prompt": SECRET}, headers=bob
    ).json()["id"]
    attached = c.post(
        f"/v1/conversations/{conv}/documents",
        files={"file": (f"{SECRET}.txt", f"The vault word is {SECRET}. " * 30, "text/plain")},
        headers=bob,
    )
    assert attached.status_code == 201, attached.text
    library = c.post(
        "/v1/documents",
        files={"file": ("mine.txt", f"My library says {SECRET}. " * 30, "text/plain")},
        headers=bob,
    )
    assert library.status_code == 201, library.text
    app.say(conv, f"remember {SECRET}", bob)
    answered = c.post(
        "/v1/responses", json={"input": f"note {SECRET}", "max_output_tokens": 2}, headers=bob
    )
    assert answered.status_code == 200, answered.text
    answer = c.get(f"/v1/conversations/{conv}", headers=bob).json()["turns"][-1]["id"]
    rated = c.post(
        f"/v1/conversations/{conv}/turns/{answer}/feedback",
        json={"rating": "down", "comment": f"it forgot {SECRET}"},
        headers=bob,
    )
    assert rated.status_code == 201, rated.text
    c.patch("/v1/users/me/memory", json={"add": [f"The user says {SECRET}"]}, headers=bob)
    shared = c.post(f"/v1/conversations/{conv}/shares", json={}, headers=bob)
    assert shared.status_code == 201, shared.text
    assert c.get("/v1/search", params={"q": SECRET}, headers=bob).status_code == 200
    store = app.services.store
    user = app.call(store.users.get_by_name, "bob")
    deadline = time.monotonic() + 60  # a search indexes the turns' vectors behind it
    while app.call(store.search.unindexed, user.id, 1):
        assert time.monotonic() < deadline, "the turns were not indexed"
        time.sleep(0.1)

    async def rest() -> None:
        turns = await store.db.fetchall(
            "SELECT id, seq FROM turns WHERE conversation_id = ? ORDER BY seq", (conv,)
        )
        chunk = await store.db.fetchone("SELECT seq FROM chunks WHERE user_id = ?", (user.id,))
        await store.documents.cite(turns[-1]["id"], [(chunk["seq"], 0.9)])
        await store.summaries.add(conv, turns[0]["id"], 1, f"bob said {SECRET}", "tiny")
        draft = await store.turns.start_draft(conv, turns[-1]["id"], "tiny")
        await store.turns.update_draft(draft, f"an answer about {SECRET}")
        await store.turns.append_tool(draft, "tool_call", f'{{"query": "{SECRET}"}}')
        await store.turns.append_tool(draft, "tool_result", f"found {SECRET}")
        await store.tool_results.put("k1", user.id, conv, "search_library", f"found {SECRET}")
        await store.tool_results.put("k2", user.id, conv, "calculator", f"pure {SECRET}")
        await store.moderation.add(
            user_id=user.id,
            tier="free",
            direction="input",
            action="flag",
            category="test",
            scores={"test": 0.9},
            text=f"flagged {SECRET}",
            conversation_id=conv,
            turn_id=turns[0]["id"],
            source=f"{SECRET}.txt",
        )
        await store.moderation.add(  # an item of no conversation (an API check)
            user_id=user.id,
            tier="free",
            direction="input",
            action="flag",
            category="test",
            scores={"test": 0.9},
            text=f"checked {SECRET}",
        )
        await store.memories.mark_extracted(conv, turns[-1]["seq"])
        await store.sessions.create(user.id, 3600)
        await store.identities.save(
            "https://id.example.com",
            "sub-bob",
            user.id,
            email=f"{SECRET}@example.com",
            full_name=SECRET,
            groups=("staff",),
            csrf_token="csrf",
            provider_disabled=False,
        )
        await store.shares.create(
            user.id,
            conv,
            f"shared {SECRET}",
            [SharedTurn("assistant", SECRET, "tiny", (SharedPassage(SECRET, 1, SECRET),))],
            turns[-1]["id"],
        )
        ws = await store.workspaces.create("team")
        await store.workspaces.set_member(ws.id, user.id, "member")

    app.call(rest)
    return str(user.id)


def test_erasing_an_account_leaves_none_of_its_rows_in_any_registered_table(app: App) -> None:
    user_id = _fill(app)
    store = app.services.store
    reached = [t for t in content.TABLES if set(t.erase) & _reach("account")]
    counts = {t.name: app.call(_left, store, t, user_id) for t in reached}
    empty = [n for n, k in counts.items() if k == 0]
    assert empty == [], "the test must give the account a row in every table it erases"

    assert app.client.delete("/v1/admin/users/bob", headers=app.admin).status_code == 204

    left = {t.name: n for t in reached if (n := app.call(_left, store, t, user_id))}
    assert left == {}
    # No file holds the words either, without any checkpoint but the erasure's own.
    for needle in (SECRET, SECRET[:9], SECRET[-9:]):
        assert holding(app, needle) == [], needle


WS_SECRET = "quillfathom5072"


def test_deleting_a_workspace_leaves_none_of_its_content_in_any_registered_table(
    app: App,
) -> None:
    c = app.client
    made = c.post(
        "/v1/workspaces", json={"name": "Support", "system_prompt": WS_SECRET}, headers=app.admin
    )
    assert made.status_code == 201, made.text
    ws = made.json()["id"]
    assert c.post(f"/v1/workspaces/{ws}/members", json={"name": "bob"}, headers=app.admin)
    doc = c.post(
        f"/v1/workspaces/{ws}/documents",
        files={"file": (f"{WS_SECRET}.txt", f"Team word {WS_SECRET}. " * 30, "text/plain")},
        headers=app.bob,
    )
    assert doc.status_code == 201, doc.text
    conv = c.post("/v1/conversations", json={"title": WS_SECRET}, headers=app.bob).json()["id"]
    app.say(conv, f"the team says {WS_SECRET}", app.bob)
    moved = c.post(
        f"/v1/conversations/{conv}/workspace", json={"workspace_id": ws}, headers=app.bob
    )
    assert moved.status_code == 200, moved.text
    store = app.services.store
    reached = [t for t in content.holding_content() if set(t.erase) & _reach("workspace")] + [
        content.table("turns"),
        content.table("turn_fts"),
    ]  # its conversation's
    assert {t.name for t in reached} >= {"workspaces", "documents", "chunks", "conversations"}
    partition = f"ws:{ws}"
    before = {t.name: app.call(_left, store, t, partition, WS_SECRET, {}) for t in reached}
    assert [n for n, k in before.items() if k == 0] == [], before

    assert c.delete(f"/v1/workspaces/{ws}", headers=app.admin).status_code == 204

    after = {t.name: app.call(_left, store, t, partition, WS_SECRET, {}) for t in reached}
    assert {n: k for n, k in after.items() if k} == {}
    members = app.call(
        store.db.fetchone, "SELECT count(*) FROM workspace_members WHERE workspace_id = ?", (ws,)
    )
    assert members[0] == 0
    for needle in (WS_SECRET, WS_SECRET[:9], WS_SECRET[-9:]):
        assert holding(app, needle) == [], needle


def test_every_content_table_says_where_the_export_holds_it() -> None:
    missing = [t.name for t in content.holding_content() if not t.export]
    assert missing == [], "content tables that say neither where they are exported nor why not"


def test_the_export_holds_each_table_the_registry_says_it_does(app: App) -> None:
    _fill(app)
    got = app.client.get("/v1/users/me/export", headers=app.bob)
    assert got.status_code == 200, got.text
    with zipfile.ZipFile(io.BytesIO(got.content)) as zf:
        files = {name: zf.read(name).decode() for name in zf.namelist()}
    absent = []
    for t in content.holding_content():
        if isinstance(t.export, content.InExport):
            word = WORDS.get(t.name, SECRET)
            held = [n for n, text in files.items() if fnmatch(n, t.export.files) and word in text]
            if not held:
                absent.append(f"{t.name} in {t.export.files}")
    assert absent == [], "declared as exported, but not in the export"


def test_every_answer_cache_of_the_chat_service_is_declared_and_erased() -> None:
    """Each cache of answers the chat service holds in RAM is a declared artifact, and the
    account erasure's one call (`forget_answers_of`) reaches it: a new cache that is not
    declared, or that the erasure skips, fails here."""
    import dataclasses
    import inspect

    from chatbox.chat.conversations import Conversations

    caches = [
        f
        for f in dataclasses.fields(Conversations)
        if isinstance(f.type, str) and f.type.endswith("Cache")
    ]
    assert {f.name for f in caches} >= {"answers", "semantic"}
    declared = " ".join(a.holds for a in content.ARTIFACTS if not a.on_disk)
    forget = inspect.getsource(Conversations.forget_answers_of)
    for f in caches:
        source = f"chatbox/chat/{_module_of(f.type)}.py"
        assert source in declared, f"{f.name} ({f.type}) is not declared in content.ARTIFACTS"
        assert f"self.{f.name}." in forget, f"erasing an account skips {f.name}"


def _module_of(type_name: str) -> str:
    """The module under chatbox/chat (in its room) that defines a cache class, as a path."""
    import importlib
    import pkgutil

    import chatbox.chat

    for info in pkgutil.walk_packages(chatbox.chat.__path__, "chatbox.chat."):
        module = importlib.import_module(info.name)
        if (
            getattr(module, type_name, None) is not None
            and getattr(module, type_name).__module__ == module.__name__
        ):
            return info.name.removeprefix("chatbox.chat.").replace(".", "/")
    raise AssertionError(f"no module defines {type_name}")
