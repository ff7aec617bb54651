"""Knowledge in the HTML UI (tiny model, real embedder): attach, chips, errors, sources,
memory page, sidebar search."""

from __future__ import annotations

import re

from litestar.testing import TestClient

from tests.web.test_pages import HX, read_stream, send, start_chat

NOTE = b"# Trip notes\n\nThe spare key to the cabin is hidden under the blue heron statue.\n"


def attach(
    client: TestClient, conv_id: str, name: str, data: bytes, mime: str = "text/markdown"
) -> object:
    return client.post(f"/ui/c/{conv_id}/documents", files={"file": (name, data, mime)}, headers=HX)


def test_attach_shows_a_chip_and_remove_takes_it_away(client: TestClient) -> None:
    conv_id, url = start_chat(client)
    read_stream(client, url)
    response = attach(client, conv_id, "notes.md", NOTE)
    assert response.status_code == 200, response.text
    assert 'id="attachments"' in response.text and "notes.md" in response.text
    assert "1 passage" in response.text
    page = client.get(f"/c/{conv_id}").text
    assert "notes.md" in page and 'id="attach-input"' in page
    assert f'hx-post="/ui/c/{conv_id}/documents"' in page
    doc_id = re.search(r'id="doc-([^"]+)"', page).group(1)  # type: ignore[union-attr]
    response = client.post(f"/ui/c/{conv_id}/documents/{doc_id}/delete", headers=HX)
    assert response.status_code == 200 and "notes.md" not in response.text
    assert client.get("/v1/documents", params={"conversation_id": conv_id}).json()["data"] == []


def test_refused_files_name_the_problem_inline(client: TestClient) -> None:
    conv_id, url = start_chat(client)
    read_stream(client, url)
    cases = [
        ("empty.md", b"   \n", "text/markdown", 422, "empty"),
        ("photo.png", b"\x89PNG\r\n\x1a\n\x00\x00", "image/png", 415, "not a document"),
        ("blob.txt", b"ab\x00cd" * 10, "text/plain", 415, "not text"),
    ]
    for name, data, mime, status, words in cases:
        response = attach(client, conv_id, name, data, mime)
        assert response.status_code == status, (name, response.text)
        assert response.headers["HX-Retarget"] == "#alerts"
        assert 'class="alert"' in response.text and words in response.text, response.text
        assert name in response.text


def test_too_large_and_encrypted_are_refused(client: TestClient) -> None:
    conv_id, _ = start_chat(client)
    limit = client.app.state.services.knowledge.documents.max_bytes
    client.app.state.services.knowledge.documents.max_bytes = 100
    try:
        response = attach(client, conv_id, "big.txt", b"word " * 100, "text/plain")
    finally:
        client.app.state.services.knowledge.documents.max_bytes = limit
    assert response.status_code == 413 and "limit" in response.text
    from io import BytesIO

    from pypdf import PdfWriter

    writer = PdfWriter()
    writer.add_blank_page(100, 100)
    writer.encrypt("secret")
    buf = BytesIO()
    writer.write(buf)
    response = attach(client, conv_id, "locked.pdf", buf.getvalue(), "application/pdf")
    assert response.status_code == 422 and "encrypted" in response.text


def test_attach_on_the_new_chat_page_starts_the_chat(client: TestClient) -> None:
    response = client.post(
        "/ui/new/documents",
        headers=HX,
        files={"file": ("notes.md", NOTE, "text/markdown")},
        data={"content": "my draft", "model": "", "system_prompt": "Be brief."},
    )
    assert response.status_code == 200, response.text
    conv_id = response.headers["HX-Push-Url"].removeprefix("/c/")
    assert "notes.md" in response.text and ">my draft</textarea>" in response.text
    assert f'hx-post="/ui/c/{conv_id}/send"' in response.text
    assert 'id="conv-list" hx-swap-oob="true"' in response.text
    before = len(client.get("/v1/conversations").json()["data"])
    bad = client.post(
        "/ui/new/documents", headers=HX, files={"file": ("empty.txt", b"", "text/plain")}
    )
    assert bad.status_code == 422 and "empty" in bad.text
    assert len(client.get("/v1/conversations").json()["data"]) == before  # none left behind


def test_sources_render_with_the_answer_and_open_the_passage(client: TestClient) -> None:
    conv_id, url = start_chat(client, "hello")
    read_stream(client, url)
    assert attach(client, conv_id, "notes.md", NOTE).status_code == 200
    final = send(client, conv_id, "Where is the spare key to the cabin?")[-1]
    assert final.event == "done"
    assert 'class="sources"' in final.data and "notes.md" in final.data
    assert "blue heron statue" in final.data  # the passage, shown on click (no request)
    page = client.get(f"/c/{conv_id}").text
    assert page.count('class="sources"') == 1 and "blue heron statue" in page
    assert "/sources" not in page  # rendered with the turn, not fetched one per answer


def test_memory_page_add_edit_delete_and_switch(client: TestClient) -> None:
    page = client.get("/memory")
    assert page.status_code == 200 and 'hx-post="/ui/memory/add"' in page.text
    assert 'href="/memory"' in page.text and 'id="search-q"' in page.text
    body = client.post("/ui/memory/add", data={"text": "I keep bees"}, headers=HX).text
    assert "I keep bees" in body
    fact_id = re.search(r'id="fact-([^"]+)"', body).group(1)  # type: ignore[union-attr]
    body = client.post(
        f"/ui/memory/{fact_id}/edit", data={"text": "I keep three hives"}, headers=HX
    ).text
    assert "I keep three hives" in body and "Saved." in body
    body = client.post("/ui/memory/enabled", data={}, headers=HX).text
    assert "Memory is off." in body and "checked" not in body
    assert client.get("/v1/users/me/memory").json()["enabled"] is False
    body = client.post(f"/ui/memory/{fact_id}/delete", headers=HX).text
    assert "I keep three hives" not in body and "Nothing remembered yet" in body


def test_sidebar_search_links_to_the_turn_with_the_words(client: TestClient) -> None:
    _, url = start_chat(client, "Tell me about aardvarks please")
    read_stream(client, url)
    body = client.get("/ui/search", params={"q": "aardvarks"}, headers=HX).text
    assert "<mark>aardvarks</mark>" in body
    href = re.search(r'href="(/c/[^"]+)"', body).group(1).replace("&amp;", "&")  # type: ignore[union-attr]
    path, anchor = href.split("#")
    assert anchor.startswith("turn-") and "q=aardvarks" in path
    assert f'id="{anchor}"' in client.get(path).text


def test_search_groups_hits_by_chat_each_with_its_line(client: TestClient) -> None:
    """Five messages of one chat that match are listed under its title once, each with its
    own snippet and link to its turn."""
    conv_id, url = start_chat(client, "Aardvarks dig burrows at night")
    read_stream(client, url)
    for line in (
        "Do aardvarks eat termites",
        "How long do aardvarks live",
        "Where do aardvarks sleep",
        "Are aardvarks related to anteaters",
    ):
        send(client, conv_id, line)
    other, url = start_chat(client, "One more note on aardvarks")
    read_stream(client, url)
    body = client.get("/ui/search", params={"q": "aardvarks"}, headers=HX).text
    groups = re.findall(r'<li class="search-group" data-conversation="([^"]+)"', body)
    assert sorted(groups) == sorted([conv_id, other])
    mine = body.split(f'data-conversation="{conv_id}"')[1].split('class="search-group"')[0]
    assert mine.count('class="hit-title"') == 1
    snippets = re.findall(r'class="hit-snippet">(.*?)</span>', mine, re.S)
    for words in ("dig burrows", "eat termites", "live", "sleep", "anteaters"):
        assert any(words in s for s in snippets), (words, snippets)
    anchors = re.findall(r'href="/c/[^"#]+#(turn-[^"]+)"', mine)
    assert len(anchors) == len(snippets) >= 5 and len(set(anchors)) == len(anchors)
