"""Export (a zip in ChatGPT's shape, Markdown per conversation, documents, memory) and
import: an export re-imports to the same conversations, searchable; a hostile file is
refused whole with a clear message."""

from __future__ import annotations

import contextlib
import io
import json
import time
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.data.conftest import App

Tree = set[tuple[tuple[str, str], ...]]


def paths(conv: dict[str, Any]) -> Tree:
    """Every root-to-leaf path of an exported conversation as (role, text) pairs."""
    mapping = conv["mapping"]
    out = set()
    for node in mapping.values():
        if node["children"]:
            continue
        path, at = [], node
        while at is not None:
            m = at["message"]
            if m is not None and m["author"]["role"] in ("user", "assistant"):
                path.append((m["author"]["role"], "\n".join(m["content"]["parts"])))
            at = mapping.get(at["parent"]) if at["parent"] else None
        out.add(tuple(reversed(path)))
    return out


def current(conv: dict[str, Any]) -> str:
    m = conv["mapping"][conv["current_node"]]["message"]
    return "\n".join(m["content"]["parts"]) if m else ""


def export(app: App, headers: dict[str, str]) -> zipfile.ZipFile:
    r = app.client.get("/v1/users/me/export", headers=headers)
    assert r.status_code == 200 and r.headers["content-type"] == "application/zip"
    assert "attachment" in r.headers["content-disposition"]
    return zipfile.ZipFile(io.BytesIO(r.content))


def _branchy(app: App, headers: dict[str, str]) -> str:
    """A conversation with a system prompt, an edit (two branches) and a regeneration."""
    c = app.client
    conv = c.post(
        "/v1/conversations",
        json={"title": "Trip planning", "system_prompt": "Be brief."},
        headers=headers,
    ).json()["id"]
    app.say(conv, "Where should I go in Lisbon?", headers)
    first = c.get(f"/v1/conversations/{conv}", headers=headers).json()["turns"]
    app.say(conv, "And what should I eat?", headers)
    r = c.post(
        f"/v1/conversations/{conv}/turns/{first[0]['id']}/edit",
        json={"content": "Where should I go in Porto?"},
        headers=headers,
    )
    assert r.status_code == 200
    turns = c.get(f"/v1/conversations/{conv}", headers=headers).json()["turns"]
    r = c.post(f"/v1/conversations/{conv}/turns/{turns[-1]['id']}/regenerate", headers=headers)
    assert r.status_code == 200
    return conv


def test_export_holds_everything_and_reimports_to_the_same(app: App) -> None:
    c = app.client
    _branchy(app, app.admin)
    other = c.post("/v1/conversations", json={}, headers=app.admin).json()["id"]
    app.say(other, "Just one line about otters", app.admin)
    doc = c.post(
        "/v1/documents",
        files={"file": ("notes.txt", "Otters hold hands while sleeping. " * 60, "text/plain")},
        headers=app.admin,
    )
    assert doc.status_code == 201
    c.patch("/v1/users/me/memory", json={"add": ["The user likes otters"]}, headers=app.admin)

    zf = export(app, app.admin)
    names = zf.namelist()
    exported = json.loads(zf.read("conversations.json"))
    assert len(exported) == 2
    trip = next(x for x in exported if x["title"] == "Trip planning")
    for key in ("id", "title", "create_time", "update_time", "current_node", "mapping"):
        assert key in trip
    node = next(n for n in trip["mapping"].values() if n["message"])
    assert set(node) == {"id", "message", "parent", "children"}
    assert node["message"]["content"]["content_type"] == "text"
    assert len(paths(trip)) == 3  # Lisbon, Porto (answer 1), Porto (answer 2)
    md = zf.read(next(n for n in names if n.endswith("trip-planning.md"))).decode()
    assert "Branch 1 of 3" in md and "Lisbon" in md and "Porto" in md and "Be brief." in md
    text = zf.read(next(n for n in names if n.startswith("documents/notes"))).decode()
    assert text.count("Otters hold hands while sleeping.") == 60
    facts = json.loads(zf.read("memory.json"))
    assert [f["text"] for f in facts] == ["The user likes otters"]

    # Bob imports the export: the same conversations, branches and all, searchable.
    r = c.post(
        "/v1/users/me/import",
        files={"file": ("conversations.json", zf.read("conversations.json"))},
        headers=app.bob,
    )
    assert r.status_code == 201 and r.json()["imported"] == 2, r.text
    again = json.loads(export(app, app.bob).read("conversations.json"))
    key = lambda x: x["title"]  # noqa: E731
    for a, b in zip(sorted(exported, key=key), sorted(again, key=key), strict=True):
        assert a["title"] == b["title"] and paths(a) == paths(b)
        assert current(a) == current(b)
        assert a["create_time"] == b["create_time"]
    prompts = {
        x["system_prompt"] for x in c.get("/v1/conversations", headers=app.bob).json()["data"]
    }
    assert prompts == {"Be brief.", None}
    hits = c.get("/v1/search", params={"q": "Porto"}, headers=app.bob).json()["data"]
    assert hits and {h["conversation_id"] for h in hits} <= set(r.json()["conversation_ids"])
    # The zip itself imports too.
    raw = c.get("/v1/users/me/export", headers=app.admin).content
    r = c.post("/v1/users/me/import", files={"file": ("export.zip", raw)}, headers=app.bob)
    assert r.status_code == 201 and r.json()["imported"] == 2


def _chatgpt(*, title: Any = "t", mapping: Any = None) -> dict[str, Any]:
    return {
        "title": title,
        "create_time": 1_700_000_000.0,
        "update_time": 1_700_000_100.0,
        "current_node": "b",
        "mapping": mapping
        if mapping is not None
        else {
            "a": {"id": "a", "message": None, "parent": None, "children": ["b"]},
            "b": {
                "id": "b",
                "message": {
                    "author": {"role": "user"},
                    "content": {"content_type": "text", "parts": ["hello"]},
                    "create_time": 1_700_000_050.0,
                },
                "parent": "a",
                "children": [],
            },
        },
    }


def _zip_bomb() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("conversations.json", b"[" + b" " * (200 * 1024 * 1024) + b"]")
    return buf.getvalue()


def _loop() -> dict[str, Any]:
    conv = _chatgpt()
    conv["mapping"]["a"]["parent"] = "b"
    return conv


HOSTILE: list[tuple[str, bytes, str]] = [
    ("not json", b"{this is not json", "not valid JSON"),
    ("not a list", json.dumps({"a": 1}).encode(), "expected a list"),
    ("too deep", b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (
        "wrong types",
        json.dumps([_chatgpt(), _chatgpt(mapping=["x"])]).encode(),
        "conversation 2 has no mapping",
    ),
    ("title type", json.dumps([_chatgpt(title=5)]).encode(), "title must be a string"),
    ("parent loop", json.dumps([_loop()]).encode(), "loop"),
    ("zip bomb", _zip_bomb(), "unpacks to over"),
    ("not a zip", b"PK\x03\x04garbage", "not a readable zip"),
    ("bad time", json.dumps([_chatgpt()]).replace("1700000000.0", "1e999").encode(), "time"),
]


@pytest.mark.parametrize(("case", "body", "message"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_files_are_refused_whole(app: App, case: str, body: bytes, message: str) -> None:
    c = app.client
    r = c.post("/v1/users/me/import", files={"file": ("c.json", body)}, headers=app.bob)
    assert r.status_code == 422, (case, r.status_code, r.text[:300])
    assert message in r.json()["error"]["message"], r.text[:300]
    assert c.get("/v1/conversations", headers=app.bob).json()["data"] == []


def test_too_large_and_too_long_are_refused(app: App) -> None:
    c = app.client
    big = json.dumps([_chatgpt()] * 3).encode() + b" " * (app.settings.max_import_bytes + 10)
    r = c.post("/v1/users/me/import", files={"file": ("c.json", big)}, headers=app.bob)
    assert r.status_code == 413
    long = _chatgpt()
    long["mapping"]["b"]["message"]["content"]["parts"] = [
        "x" * (app.settings.max_message_chars + 1)
    ]
    r = c.post(
        "/v1/users/me/import",
        files={"file": ("c.json", json.dumps([_chatgpt(), long]).encode())},
        headers=app.bob,
    )
    assert r.status_code == 422 and "characters" in r.text
    assert c.get("/v1/conversations", headers=app.bob).json()["data"] == []


def _message(role: str, content: dict[str, Any], children: list[str], parent: str) -> Any:
    return {
        "message": {"author": {"role": role}, "content": content},
        "parent": parent,
        "children": children,
    }


def test_an_import_reports_what_it_left_out(app: App) -> None:
    """A voice chat's words come across; its recording, an image, a tool's output and a
    second system message are left out, each counted with its reason and examples."""
    voice = {
        "content_type": "multimodal_text",
        "parts": [
            {"content_type": "audio_transcription", "text": "what do otters eat"},
            {"content_type": "audio_asset_pointer", "asset_pointer": "sediment://file_1"},
        ],
    }
    picture = {
        "content_type": "multimodal_text",
        "parts": [
            {"content_type": "image_asset_pointer", "asset_pointer": "file-service://x"},
            "and what is this?",
        ],
    }
    mapping = {
        "r": {"message": None, "parent": None, "children": ["v"]},
        "v": _message("user", voice, ["t"], "r"),
        "t": _message("tool", {"content_type": "text", "parts": ["search results"]}, ["s"], "v"),
        "s": _message("system", {"content_type": "text", "parts": ["be terse"]}, ["a"], "t"),
        "a": _message("assistant", {"content_type": "text", "parts": ["Fish."]}, ["p"], "s"),
        "p": _message("user", picture, [], "a"),
    }
    body = json.dumps([{"title": "Voice chat", "current_node": "p", "mapping": mapping}])
    r = app.client.post(
        "/v1/users/me/import", files={"file": ("c.json", body.encode())}, headers=app.bob
    )
    assert r.status_code == 201, r.text
    done = r.json()
    assert (done["imported"], done["messages"]) == (1, 3)
    dropped = {d["kind"]: d for d in done["dropped"]}
    assert set(dropped) == {"voice recording", "image", "tool message", "system message"}
    assert all(d["count"] == 1 and d["reason"] for d in dropped.values())
    assert "'Voice chat'" in dropped["image"]["examples"][0]
    conv = app.client.get(f"/v1/conversations/{done['conversation_ids'][0]}", headers=app.bob)
    texts = [t["content"] for t in conv.json()["turns"]]
    assert texts == ["what do otters eat", "Fish.", "and what is this?"]


async def test_an_import_is_written_in_short_transactions_hidden_until_done(
    database: Path | str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many small transactions, none of it visible before the last; an import cut short
    stays hidden and the sweeper erases it once it is clearly not being written."""
    from chatbox.accounts import AuditLog
    from chatbox.chat.policy import Policy
    from chatbox.data import retention as retention_module
    from chatbox.store import Store
    from chatbox.store import transfer as transfer_module
    from chatbox.store.erasure import ErasureRepo
    from chatbox.store.transfer import ConversationIn, TransferRepo, TurnIn

    monkeypatch.setattr(transfer_module, "IMPORT_ROWS", 5, raising=False)
    store = await Store.open(database)
    try:
        ann = await store.users.create("ann")
        repo = TransferRepo(store.db)
        convs = [
            ConversationIn(f"chat {n}", None, 1.0, 2.0, [TurnIn("user", f"w{n}", None, 1.5)], 0)
            for n in range(20)
        ]
        seen: list[int] = []  # conversations visible as each write transaction begins
        real = store.db.transaction

        async def visible() -> int:
            return len(await repo.conversations(ann.id))

        @contextlib.asynccontextmanager
        async def watched() -> AsyncIterator[Any]:
            seen.append(await visible())
            async with real() as tx:
                yield tx

        monkeypatch.setattr(store.db, "transaction", watched)
        ids = await repo.import_conversations(ann.id, convs)
        assert len(seen) >= 9  # 40 rows, 5 a transaction, then one that shows them all
        assert seen == [0] * len(seen)
        assert await visible() == 20 and len(ids) == 20

        real_batches = transfer_module._batches

        def cut_short(*args: Any) -> Any:
            for n, batch in enumerate(real_batches(*args)):
                if n == 2:
                    raise OSError("disk full")  # as a crash would leave it
                yield batch

        monkeypatch.setattr(transfer_module, "_batches", cut_short)
        with pytest.raises(OSError):
            await repo.import_conversations(ann.id, convs)
        assert await visible() == 20  # none of the cut import shows
        rows = await repo.content_rows()
        assert rows["conversations"] > 20

        erasure = ErasureRepo(store.db)
        now = [time.time()]
        retention = retention_module.Retention(
            erasure, Policy.from_dict({}), erasure.conversations, AuditLog(store), lambda: now[0]
        )
        assert (await retention.run()).unfinished == 0  # maybe still being written
        now[0] += retention_module.IMPORT_LEASE_S + 1
        report = await retention.run()
        assert report.unfinished == rows["conversations"] - 20 and report.erased.turns > 0
        assert await visible() == 20
    finally:
        await store.close()
