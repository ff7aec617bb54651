"""Import and export against `chatbox serve` as a user runs it: a chatbox export brings back
its documents and memory facts for whoever imports it; an impossible time is left out (and
reported) on the way in, and the export keeps working; a zero-retention account is refused."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.served import Served

NOTES = "Otters hold hands while they sleep so they do not drift apart. " * 40


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Served]:
    with Served(tmp_path_factory.mktemp("imports"), model=tiny_gguf) as served:
        yield served


def chat(title: str, text: str, **times: Any) -> dict[str, Any]:
    """One conversation of ChatGPT's export shape: a user message and an answer."""
    return {
        "id": f"src-{title}",
        "title": title,
        "create_time": times.get("create_time", 1_700_000_000.0),
        "update_time": times.get("update_time", 1_700_000_100.0),
        "current_node": "b",
        "mapping": {
            "r": {"id": "r", "message": None, "parent": None, "children": ["a"]},
            "a": {
                "id": "a",
                "message": {
                    "author": {"role": "user"},
                    "content": {"content_type": "text", "parts": [text]},
                    "create_time": times.get("message_time", 1_700_000_050.0),
                },
                "parent": "r",
                "children": ["b"],
            },
            "b": {
                "id": "b",
                "message": {
                    "author": {"role": "assistant"},
                    "content": {"content_type": "text", "parts": ["Noted."]},
                },
                "parent": "a",
                "children": [],
            },
        },
    }


def upload(box: Served, key: str, name: str, body: bytes) -> httpx.Response:
    return httpx.post(
        box.url + "/v1/users/me/import",
        files={"file": (name, body)},
        headers=box.auth(key),
        timeout=120,
    )


def export(box: Served, key: str) -> zipfile.ZipFile:
    r = httpx.get(box.url + "/v1/users/me/export", headers=box.auth(key), timeout=120)
    assert r.status_code == 200, r.text[:500]
    return zipfile.ZipFile(io.BytesIO(r.content))


def get(box: Served, key: str, path: str) -> Any:
    r = httpx.get(box.url + path, headers=box.auth(key), timeout=60)
    assert r.status_code == 200, r.text[:500]
    return r.json()


def test_a_chatbox_export_brings_back_documents_and_memory(box: Served) -> None:
    ann, bea = box.user("ann"), box.user("bea")
    r = upload(box, ann, "c.json", json.dumps([chat("otters", "Tell me about otters")]).encode())
    assert r.status_code == 201, r.text
    conv = r.json()["conversation_ids"][0]
    r = httpx.post(
        f"{box.url}/v1/conversations/{conv}/documents",
        files={"file": ("otter-notes.txt", NOTES.encode(), "text/plain")},
        headers=box.auth(ann),
        timeout=120,
    )
    assert r.status_code == 201, r.text
    r = httpx.patch(
        box.url + "/v1/users/me/memory",
        json={"add": ["The user's favourite animal is the otter"]},
        headers=box.auth(ann),
        timeout=120,
    )
    assert r.status_code == 200, r.text
    zf = export(box, ann)
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w") as out:
        for name in zf.namelist():
            out.writestr(name, zf.read(name))

    r = upload(box, bea, "chatbox-ann.zip", raw.getvalue())
    assert r.status_code == 201, r.text
    done = r.json()
    docs = get(box, bea, "/v1/documents")["data"]
    assert [d["name"] for d in docs] == ["otter-notes.txt"]
    assert docs[0]["conversation_id"] == done["conversation_ids"][0]  # attached as it was
    facts = get(box, bea, "/v1/users/me/memory")["data"]
    assert [f["text"] for f in facts] == ["The user's favourite animal is the otter"]
    assert (done["imported"], done["documents"], done["memories"]) == (1, 1, 1), done
    assert done["dropped"] == []
    again = export(box, bea)
    text = again.read(next(n for n in again.namelist() if n.startswith("documents/otter")))
    assert text.decode().count("Otters hold hands") == 40
    assert get(box, ann, "/v1/documents")["data"][0]["id"] != docs[0]["id"]  # bea's own copy


def test_an_impossible_time_is_reported_and_the_export_still_works(box: Served) -> None:
    cid = box.user("cid")
    body = json.dumps(
        [
            chat("from the far future", "hello", create_time=1e300, message_time=-5.0),
            chat("ordinary", "hi again"),
        ]
    ).encode()
    r = upload(box, cid, "c.json", body)
    assert r.status_code == 201, r.text
    zf = export(box, cid)
    convs = json.loads(zf.read("conversations.json"))
    assert sorted(c["title"] for c in convs) == ["from the far future", "ordinary"]
    assert all(0 < c["create_time"] < 4e9 for c in convs)
    listed = get(box, cid, "/v1/conversations")["data"]
    assert len(listed) == 2
    dropped = r.json()["dropped"]
    assert [(d["kind"], d["count"]) for d in dropped] == [("impossible time", 2)], dropped
    assert "create_time 1e+300" in " ".join(dropped[0]["examples"])


def test_a_zero_retention_account_cannot_import(box: Served) -> None:
    dee = box.user("dee")
    r = httpx.patch(
        box.url + "/v1/users/me/retention",
        json={"zero_retention": True},
        headers=box.auth(dee),
        timeout=60,
    )
    assert r.status_code == 200, r.text
    r = upload(box, dee, "c.json", json.dumps([chat("kept?", "keep me")]).encode())
    assert r.status_code == 422 and "zero-data-retention" in r.text, r.text
    assert get(box, dee, "/v1/conversations")["data"] == []
