"""The knowledge API on the tiny model: embeddings, memory PATCH, isolation between users,
documents with citations, bad files, search."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from litestar.testing import TestClient

from chatbox.app import create_app
from chatbox.catalog.registry import ModelRegistry
from chatbox.knowledge.embedder import Embedder
from chatbox.settings import Settings
from tests.conftest import bearer, seed_user
from tests.sse import Event, parse_sse

MANUAL = (
    "Zephyr-9 pump manual.\n\nThe Zephyr-9 pump must be descaled every 90 days using citric "
    "acid. Never use vinegar, which damages the seals.\n\nThe warranty lasts five years if the "
    "pump is registered within 30 days of purchase.\n\n" + "Unrelated filler text. " * 120
)


@pytest.fixture
def two(
    settings: Settings, registry: ModelRegistry, embedder: Embedder
) -> Iterator[tuple[TestClient, dict[str, str], dict[str, str]]]:
    """The app with two users: the admin (client's default headers) and member bob."""
    # The tiny model's byte-level vocabulary spends a token per character or two: give the
    # retrieved passages the room a real tokenizer would leave them.
    settings = settings.with_overrides(n_ctx_per_seq=4096, n_ctx=8192, knowledge_tokens=3000)
    admin = bearer(seed_user(settings))
    bob = bearer(seed_user(settings, "bob", role="member", tier="paid"))
    with TestClient(create_app(settings, registry), timeout=120) as client:
        yield client, admin, bob


def _events(response) -> list[Event]:  # type: ignore[no-untyped-def]
    assert response.status_code == 200, response.text
    return list(parse_sse(iter(response.text.split("\n"))))


def test_embeddings_openai_shape(two) -> None:  # type: ignore[no-untyped-def]
    client, admin, _ = two
    one = client.post("/v1/embeddings", json={"input": "hello world"}, headers=admin).json()
    assert one["object"] == "list" and len(one["data"][0]["embedding"]) == 384
    assert one["usage"]["prompt_tokens"] == one["usage"]["total_tokens"] > 0
    many = client.post(
        "/v1/embeddings",
        json={"input": ["a cat", "a dog"], "model": "all-MiniLM-L6-v2"},
        headers=admin,
    )
    assert [d["index"] for d in many.json()["data"]] == [0, 1]
    bad = client.post("/v1/embeddings", json={"input": "x", "model": "nope"}, headers=admin)
    assert bad.status_code == 404
    empty = client.post("/v1/embeddings", json={"input": []}, headers=admin)
    assert empty.status_code == 400  # as OpenAI's API answers invalid input
    assert empty.json()["error"] == {
        "message": empty.json()["error"]["message"],
        "type": "invalid_request_error",
        "param": "input",
        "code": None,
    }
    shorter = client.post("/v1/embeddings", json={"input": "x", "dimensions": 64}, headers=admin)
    assert shorter.status_code == 400 and shorter.json()["error"]["param"] == "dimensions"
    whole = client.post("/v1/embeddings", json={"input": "x", "dimensions": 384}, headers=admin)
    assert len(whole.json()["data"][0]["embedding"]) == 384


def test_memory_patch_and_isolation(two) -> None:  # type: ignore[no-untyped-def]
    client, admin, bob = two
    r = client.patch(
        "/v1/users/me/memory",
        headers=bob,
        json={"add": ["The user prefers metric units", "The user lives in Paris"]},
    )
    assert r.status_code == 200, r.text
    facts = {f["text"]: f["id"] for f in r.json()["data"]}
    assert set(facts) == {"The user prefers metric units", "The user lives in Paris"}
    r = client.patch("/v1/users/me/memory", headers=bob, json={"add": ["I live in Berlin"]})
    assert r.json()["added"][0]["action"] == "replaced"

    # Another user's fact ids are not found, and nothing changes.
    r = client.patch(
        "/v1/users/me/memory",
        headers=admin,
        json={"remove": [facts["The user prefers metric units"]]},
    )
    assert r.status_code == 404
    bob_id = r.json() and client.get("/v1/users/me/memory", headers=bob).json()["user_id"]
    admin_id = client.get("/v1/users/me/memory", headers=admin).json()["user_id"]
    assert client.get(f"/v1/users/{admin_id}/memory", headers=bob).status_code == 404
    # Memory is content: an admin cannot read anyone else's either.
    assert client.get(f"/v1/users/{bob_id}/memory", headers=admin).status_code == 404
    assert len(client.get(f"/v1/users/{bob_id}/memory", headers=bob).json()["data"]) == 2
    r = client.patch(
        "/v1/users/me/memory",
        headers=bob,
        json={"remove": [facts["The user prefers metric units"]], "enabled": False},
    )
    assert r.status_code == 200 and r.json()["enabled"] is False
    assert [f["text"] for f in r.json()["data"]] == ["I live in Berlin"]


def test_memory_is_its_owner_alone_admins_included(two) -> None:  # type: ignore[no-untyped-def]
    client, admin, bob = two
    ann = bearer(seed_user(client.app.state.services.settings, "ann", role="member"))
    r = client.patch("/v1/users/me/memory", headers=bob, json={"add": ["Bob keeps bees"]})
    assert r.status_code == 200, r.text
    bob_id, (fact,) = r.json()["user_id"], r.json()["data"]
    own = client.get(f"/v1/users/{bob_id}/memory", headers=bob)  # one's own id works too
    assert own.status_code == 200 and own.json()["data"] == [fact]
    for who in (admin, ann):  # the admin and another member alike
        got = client.get(f"/v1/users/{bob_id}/memory", headers=who)
        assert got.status_code == 404 and "bees" not in got.text
        changed = client.patch(
            f"/v1/users/{bob_id}/memory",
            headers=who,
            json={"add": ["planted"], "remove": [fact["id"]], "enabled": False},
        )
        assert changed.status_code == 404 and "bees" not in changed.text
        gone = client.delete(f"/v1/users/{bob_id}/memory/{fact['id']}", headers=who)
        assert gone.status_code == 404
        # An unknown user id answers the same: nothing tells who exists.
        assert client.get("/v1/users/u_nobody/memory", headers=who).status_code == 404
    after = client.get("/v1/users/me/memory", headers=bob).json()
    assert after["data"] == [fact] and after["enabled"] is True


def test_document_round_trip_with_citations(two, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    client, admin, bob = two
    conv = client.post("/v1/conversations", json={}, headers=admin).json()
    r = client.post(
        f"/v1/conversations/{conv['id']}/documents",
        headers=admin,
        files={"file": ("manual.txt", MANUAL.encode(), "text/plain")},
    )
    assert r.status_code == 201, r.text
    doc = r.json()
    assert doc["chunks"] >= 2 and doc["conversation_id"] == conv["id"]

    events = _events(
        client.post(
            f"/v1/conversations/{conv['id']}/turns",
            headers=admin,
            json={"content": "How often should I descale the pump?"},
        )
    )
    kinds = [e.event for e in events]
    assert "citations" in kinds, [(e.event, e.data[:200]) for e in events]
    assert kinds.index("citations") < kinds.index("done")
    cited = next(e for e in events if e.event == "citations").json()
    first = cited["citations"][0]
    assert first["document_id"] == doc["id"] and "90 days" in first["text"]
    turn_id = next(e for e in events if e.event == "done").json()["turn_id"]
    stored = client.get(
        f"/v1/conversations/{conv['id']}/turns/{turn_id}/citations", headers=admin
    ).json()["data"]
    assert stored[0]["chunk_id"] == first["chunk_id"]
    passage = client.get(f"/v1/passages/{first['chunk_id']}", headers=admin).json()
    assert "citric acid" in passage["text"]

    # Bob sees none of it, and his own turns never draw on it.
    assert client.get(f"/v1/documents/{doc['id']}", headers=bob).status_code == 404
    assert client.get(f"/v1/passages/{first['chunk_id']}", headers=bob).status_code == 404
    assert client.delete(f"/v1/documents/{doc['id']}", headers=bob).status_code == 404
    assert (
        client.post(
            f"/v1/conversations/{conv['id']}/documents",
            headers=bob,
            files={"file": ("x.txt", b"hello there", "text/plain")},
        ).status_code
        == 404
    )
    mine = client.post("/v1/conversations", json={}, headers=bob).json()
    events = _events(
        client.post(
            f"/v1/conversations/{mine['id']}/turns",
            headers=bob,
            json={"content": "How often should I descale the pump?"},
        )
    )
    assert "citations" not in [e.event for e in events]

    # Deleting the document removes its chunks, vectors and citations.
    assert client.delete(f"/v1/documents/{doc['id']}", headers=admin).status_code == 204
    assert client.get(f"/v1/passages/{first['chunk_id']}", headers=admin).status_code == 404
    assert (
        client.get(
            f"/v1/conversations/{conv['id']}/turns/{turn_id}/citations", headers=admin
        ).json()["data"]
        == []
    )


def _encrypted_pdf() -> bytes:
    from pypdf import PdfWriter

    writer = PdfWriter()
    writer.add_blank_page(width=200, height=200)
    writer.encrypt(user_password="secret", owner_password="owner")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


@pytest.mark.parametrize(
    ("name", "body", "mime", "status", "words"),
    [
        ("empty.txt", b"", "text/plain", 422, "empty"),
        ("blank.md", b"   \n\n  ", "text/markdown", 422, "empty"),
        (
            "photo.png",
            b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(200),
            "image/png",
            415,
            "not a document",
        ),
        ("data.txt", b"\x00\x01\x02binary\x00" * 50, "text/plain", 415, "not text"),
        ("locked.pdf", None, "application/pdf", 422, "encrypted"),
        ("broken.pdf", b"%PDF-1.7\nthis is not really a pdf", "application/pdf", 415, "PDF"),
        ("blank.pdf", "blank", "application/pdf", 422, "no text"),
    ],
)
def test_bad_files_are_refused_and_nothing_is_stored(
    two,
    name: str,
    body: bytes | str | None,
    mime: str,
    status: int,
    words: str,
) -> None:  # type: ignore[no-untyped-def]
    client, admin, _ = two
    if body is None:
        body = _encrypted_pdf()
    elif body == "blank":
        from pypdf import PdfWriter

        writer, out = PdfWriter(), io.BytesIO()
        writer.add_blank_page(width=200, height=200)
        writer.write(out)
        body = out.getvalue()
    r = client.post("/v1/documents", headers=admin, files={"file": (name, body, mime)})
    assert r.status_code == status, r.text
    assert words.lower() in r.json()["error"]["message"].lower()
    assert client.get("/v1/documents", headers=admin).json()["data"] == []


def test_too_large(settings: Settings, registry: ModelRegistry, embedder: Embedder) -> None:
    small = settings.with_overrides(max_upload_bytes=1000)
    admin = bearer(seed_user(small))
    with TestClient(create_app(small, registry), timeout=60) as client:
        r = client.post(
            "/v1/documents",
            headers=admin,
            files={"file": ("big.txt", b"word " * 1000, "text/plain")},
        )
        assert r.status_code == 413, r.text
        assert "limit" in r.json()["error"]["message"]
        assert client.get("/v1/documents", headers=admin).json()["data"] == []


def test_search_words_and_meaning(two) -> None:  # type: ignore[no-untyped-def]
    client, admin, bob = two
    conv = client.post("/v1/conversations", json={}, headers=admin).json()
    _events(
        client.post(
            f"/v1/conversations/{conv['id']}/turns",
            headers=admin,
            json={"content": "My sourdough starter smells like acetone"},
        )
    )
    other = client.post("/v1/conversations", json={}, headers=bob).json()
    _events(
        client.post(
            f"/v1/conversations/{other['id']}/turns",
            headers=bob,
            json={"content": "Sourdough secrets of bob"},
        )
    )

    words = client.get(
        "/v1/search", params={"q": "sourdough", "mode": "words"}, headers=admin
    ).json()["data"]
    assert {h["conversation_id"] for h in words} == {conv["id"]}  # Bob's chat is not found
    assert "<mark>sourdough</mark>" in words[0]["highlighted"].lower()
    assert words[0]["url"].startswith(f"/c/{conv['id']}")
    # The turns are embedded behind the first search by meaning: found by meaning once indexed.
    deadline = time.monotonic() + 60
    while True:
        meaning = client.get(
            "/v1/search", params={"q": "bread baking yeast", "mode": "meaning"}, headers=admin
        ).json()["data"]
        if meaning or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert meaning and meaning[0]["conversation_id"] == conv["id"]
    assert all(h["conversation_id"] != other["id"] for h in meaning)
    # A deleted conversation is no longer found.
    client.delete(f"/v1/conversations/{conv['id']}", headers=admin)
    assert client.get("/v1/search", params={"q": "sourdough"}, headers=admin).json()["data"] == []


def test_memory_page_search_box_and_sources(two) -> None:  # type: ignore[no-untyped-def]
    client, admin, bob = two
    page = client.get("/memory", headers=bob)
    assert page.status_code == 200 and "Use memory in my conversations" in page.text
    r = client.post("/ui/memory/add", data={"text": "I prefer metric units"}, headers=bob)
    assert "I prefer metric units" in r.text
    fact_id = client.get("/v1/users/me/memory", headers=bob).json()["data"][0]["id"]
    r = client.post(f"/ui/memory/{fact_id}/edit", data={"text": "I prefer SI units"}, headers=bob)
    assert "I prefer SI units" in r.text
    assert client.post(f"/ui/memory/{fact_id}/delete", headers=admin).status_code == 404
    assert client.get("/v1/users/me/memory", headers=bob).json()["data"]  # not admin's to delete
    r = client.post(f"/ui/memory/{fact_id}/delete", headers=bob)
    assert "Nothing remembered yet" in r.text
    r = client.post("/ui/memory/enabled", data={}, headers=bob)
    assert client.get("/v1/users/me/memory", headers=bob).json()["enabled"] is False

    conv = client.post("/v1/conversations", json={}, headers=admin).json()
    client.post(
        f"/v1/conversations/{conv['id']}/documents",
        headers=admin,
        files={"file": ("manual.md", MANUAL.encode(), "text/markdown")},
    )
    events = _events(
        client.post(
            f"/v1/conversations/{conv['id']}/turns",
            headers=admin,
            json={"content": "How long is the pump warranty?"},
        )
    )
    turn_id = next(e for e in events if e.event == "done").json()["turn_id"]
    home = client.get(f"/c/{conv['id']}", headers=admin).text
    assert 'id="search-q"' in home and 'class="sources"' in home  # rendered with the turn
    assert "manual.md" in home.split(f'id="turn-{turn_id}"')[1]
    sources = client.get(f"/ui/c/{conv['id']}/turns/{turn_id}/sources", headers=admin).text
    assert "manual.md" in sources
    chunk = next(e for e in events if e.event == "citations").json()["citations"][0]
    assert "warranty" in client.get(f"/ui/passages/{chunk['chunk_id']}", headers=admin).text
    assert client.get(f"/ui/c/{conv['id']}/turns/{turn_id}/sources", headers=bob).status_code == 404
    found = client.get("/ui/search", params={"q": "pump warranty"}, headers=admin).text
    assert f"/c/{conv['id']}?turn=" in found and "<mark>" in found
