"""The library page (tiny model, real embedder): upload, list, retrieval from any
conversation, refused files, delete, and isolation between users."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from litestar.testing import TestClient

from chatbox.app import create_app
from chatbox.catalog.registry import ModelRegistry
from chatbox.settings import Settings
from tests.conftest import bearer, seed_user
from tests.web.test_knowledge_pages import NOTE
from tests.web.test_pages import HX, read_stream, send, start_chat


@pytest.fixture
def two(settings: Settings, registry: ModelRegistry) -> Iterator[tuple[TestClient, dict[str, str]]]:
    """The app as the admin (the client's default headers), and member bob's headers."""
    admin = bearer(seed_user(settings))
    bob = bearer(seed_user(settings, "bob", role="member", tier="paid"))
    with TestClient(create_app(settings, registry), timeout=60) as client:
        client.headers.update(admin)
        yield client, bob


def upload(
    client: TestClient,
    name: str,
    data: bytes,
    mime: str = "text/markdown",
    headers: dict[str, str] | None = None,
) -> object:
    return client.post(
        "/ui/library/documents",
        files={"file": (name, data, mime)},
        headers={**HX, **(headers or {})},
    )


def doc_id_of(body: str, name: str) -> str:
    match = re.search(r'id="doc-([^"]+)"[^<]*<span class="library-doc-icon"', body)
    assert match and name in body, body
    return match.group(1)


def library_ids(client: TestClient, headers: dict[str, str] | None = None) -> list[str]:
    docs = client.get("/v1/documents", headers=headers or {}).json()["data"]
    return [d["id"] for d in docs if d["conversation_id"] is None]


def test_library_page_upload_lists_it_for_every_conversation(client: TestClient) -> None:
    page = client.get("/library")
    assert page.status_code == 200, page.text
    assert 'hx-post="/ui/library/documents"' in page.text
    assert 'hx-encoding="multipart/form-data"' in page.text and 'name="file"' in page.text
    assert 'accept=".txt,.text,.md,' in page.text  # the picker offers documents
    assert 'accept=".txt,.text,.md,' in client.get("/").text  # as the composer's does
    assert 'href="/library" aria-current="page"' in page.text  # the sidebar link, active
    assert 'href="/memory"' in page.text and "Your library is empty" in page.text
    assert "<title>Library · chatbox</title>" in page.text and "Library</h1>" in page.text
    memory = client.get("/memory").text
    assert 'href="/library"' in memory and 'href="/memory" aria-current="page"' in memory
    assert "<title>Memory · chatbox</title>" in memory

    response = upload(client, "notes.md", NOTE)
    assert response.status_code == 200, response.text
    assert 'id="library-list"' in response.text and "Added notes.md." in response.text
    assert "1 passage" in response.text and "bytes" in response.text
    doc_id = doc_id_of(response.text, "notes.md")
    assert f'hx-post="/ui/library/documents/{doc_id}/delete"' in response.text
    assert "notes.md" in client.get("/library").text
    (doc,) = client.get("/v1/documents").json()["data"]
    assert doc["id"] == doc_id and doc["conversation_id"] is None and doc["chunks"] == 1

    # A chat started afterwards draws on it, and cites it, though nothing was attached there.
    conv_id, url = start_chat(client, "hello")
    read_stream(client, url)
    assert client.get("/v1/documents", params={"conversation_id": conv_id}).json()["data"] == []
    final = send(client, conv_id, "Where is the spare key to the cabin?")[-1]
    assert final.event == "done"
    assert 'class="sources"' in final.data and "notes.md" in final.data
    assert "blue heron statue" in final.data

    # Deleting it takes it from the page, the API and later answers' sources.
    response = client.post(f"/ui/library/documents/{doc_id}/delete", headers=HX)
    assert response.status_code == 200, response.text
    assert "Deleted notes.md." in response.text and "Your library is empty" in response.text
    assert f'id="doc-{doc_id}"' not in response.text
    assert client.get("/v1/documents").json()["data"] == []
    assert client.post(f"/ui/library/documents/{doc_id}/delete", headers=HX).status_code == 404


def test_refused_files_say_why_and_store_nothing(client: TestClient) -> None:
    cases = [
        ("empty.md", b"", "text/markdown", 422, "empty.md is empty"),
        ("blank.md", b"   \n", "text/markdown", 422, "empty"),
        ("photo.png", b"\x89PNG\r\n\x1a\n\x00\x00", "image/png", 415, "not a document"),
        ("blob.txt", b"ab\x00cd" * 10, "text/plain", 415, "not text"),
    ]
    for name, data, mime, status, words in cases:
        response = upload(client, name, data, mime)
        assert response.status_code == status, (name, response.text)
        assert response.headers["HX-Retarget"] == "#alerts"
        assert 'class="alert"' in response.text and words in response.text, response.text
        assert "Not added to your library:" in response.text
    from io import BytesIO

    from pypdf import PdfWriter

    writer = PdfWriter()
    writer.add_blank_page(100, 100)
    writer.encrypt("secret")
    buf = BytesIO()
    writer.write(buf)
    response = upload(client, "locked.pdf", buf.getvalue(), "application/pdf")
    assert response.status_code == 422 and "encrypted" in response.text
    limit = client.app.state.services.knowledge.documents.max_bytes
    client.app.state.services.knowledge.documents.max_bytes = 100
    try:
        response = upload(client, "big.txt", b"word " * 100, "text/plain")
    finally:
        client.app.state.services.knowledge.documents.max_bytes = limit
    assert response.status_code == 413 and "limit" in response.text
    assert client.get("/v1/documents").json()["data"] == []
    assert "Your library is empty" in client.get("/library").text


def test_library_upload_ignores_a_conversation_field(client: TestClient) -> None:
    conv_id, url = start_chat(client)
    read_stream(client, url)
    response = client.post(
        "/ui/library/documents",
        headers=HX,
        data={"conversation_id": conv_id},
        files={"file": ("notes.md", NOTE, "text/markdown")},
    )
    assert response.status_code == 200, response.text
    (doc,) = client.get("/v1/documents").json()["data"]
    assert doc["conversation_id"] is None


def test_conversation_attachments_are_not_in_the_library(client: TestClient) -> None:
    conv_id, url = start_chat(client)
    read_stream(client, url)
    attached = client.post(
        f"/ui/c/{conv_id}/documents", headers=HX, files={"file": ("chat.md", NOTE, "text/markdown")}
    )
    assert attached.status_code == 200, attached.text
    doc_id = re.search(r'id="doc-([^"]+)"', attached.text).group(1)  # type: ignore[union-attr]
    assert "chat.md" not in client.get("/library").text
    # The library's delete is for library documents only.
    assert client.post(f"/ui/library/documents/{doc_id}/delete", headers=HX).status_code == 404
    assert len(client.get("/v1/documents").json()["data"]) == 1


def test_another_users_library_is_invisible_and_not_deletable(two) -> None:  # type: ignore[no-untyped-def]
    client, bob = two
    response = upload(client, "notes.md", NOTE)
    assert response.status_code == 200, response.text
    doc_id = doc_id_of(response.text, "notes.md")
    page = client.get("/library", headers=bob)
    assert page.status_code == 200 and "notes.md" not in page.text
    assert library_ids(client, bob) == []
    refused = client.post(f"/ui/library/documents/{doc_id}/delete", headers={**HX, **bob})
    assert refused.status_code == 404 and "notes.md" not in refused.text
    assert refused.headers["HX-Retarget"] == "#alerts"
    assert library_ids(client) == [doc_id]  # still there for its owner


def test_a_browser_session_needs_the_pages_csrf_token(client: TestClient) -> None:
    from tests.conftest import ADMIN_NAME, ADMIN_PASSWORD

    del client.headers["Authorization"]  # a cookie session, as in a browser
    login = client.get("/login").text
    token = login.split('name="csrf_token" value="')[1].split('"')[0]
    r = client.post(
        "/login",
        data={
            "name": ADMIN_NAME,
            "password": ADMIN_PASSWORD,
            "csrf_token": token,
            "next": "/library",
        },
    )
    assert r.status_code == 200 and 'id="library-upload"' in r.text, r.text
    csrf = re.search(r'"x-csrf-token": "([^"]+)"', r.text.replace("&#34;", '"'))
    assert csrf, r.text[:600]
    assert upload(client, "notes.md", NOTE).status_code == 403
    response = upload(client, "notes.md", NOTE, headers={"x-csrf-token": csrf.group(1)})
    assert response.status_code == 200, response.text
    doc_id = doc_id_of(response.text, "notes.md")
    path = f"/ui/library/documents/{doc_id}/delete"
    assert client.post(path, headers=HX).status_code == 403
    assert client.post(path, headers={**HX, "x-csrf-token": csrf.group(1)}).status_code == 200
