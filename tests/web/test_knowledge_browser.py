"""Knowledge in headless Chromium against the real default model (SmolLM2-135M): attach a
document and see its passage cited, the memory page, and sidebar search to a turn.

Run: pytest -m browser tests/web/test_knowledge_browser.py
Screenshots: /tmp/chatbox-knowledge*.png
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LiveServer
from tests.web.test_browser import browser, login, page, send, server  # noqa: F401

pytestmark = pytest.mark.browser

NOTE = """# Cabin notes

Directions: take the gravel road past the mill.

The spare key to the cabin is hidden under the blue heron statue by the porch.
"""
QUESTION = "Where is the spare key to the cabin hidden?"
DONE = "#turns > .turn.assistant[data-status]:not(.streaming)"


def note_files(folder: Path, name: str) -> tuple[Path, Path]:
    """The cabin notes under `name`, and an empty file (refused on upload)."""
    note, empty = folder / name, folder / "empty.md"
    note.write_text(NOTE)
    empty.write_text("")
    return note, empty


def wait_answer(pg: Any, count: int) -> None:
    pg.wait_for_function(
        "n => document.querySelectorAll('#turns > .turn.assistant[data-status]"
        ":not(.streaming)').length >= n",
        arg=count,
        timeout=120_000,
    )


def test_attach_ask_and_open_the_cited_passage(
    server: LiveServer,  # noqa: F811
    page: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    note, empty = note_files(tmp_path, "cabin-notes.md")
    page.goto(server.url + "/")
    page.fill("#composer-input", "draft kept")
    # The paperclip opens the file picker; choosing a file starts the chat with it attached.
    with page.expect_file_chooser() as chooser:
        page.get_by_role("button", name="Attach a document").click()
    chooser.value.set_files(str(note))
    chip = page.wait_for_selector("#attachments .chip:has-text('cabin-notes.md')")
    assert "1 passage" in chip.inner_text()
    assert "/c/" in page.url
    assert page.locator("#composer-input").input_value() == "draft kept"

    # A refused file says what is wrong, inline, and changes nothing.
    page.set_input_files("#attach-input", str(empty))
    alert = page.wait_for_selector("#alerts .alert").inner_text()
    assert "empty.md is empty" in alert, alert
    assert page.locator("#attachments .chip:not(.chip-busy)").count() == 1

    send(page, QUESTION)
    wait_answer(page, 1)
    # Sources appear with the finished answer, without a reload.
    source = page.wait_for_selector("#turns > .turn.assistant .sources summary")
    assert "cabin-notes.md" in source.inner_text()
    assert not page.locator(".passage").first.is_visible()
    source.click()
    passage = page.locator(".source[open] .passage")
    passage.wait_for(state="visible")
    assert "blue heron statue" in passage.inner_text()
    page.screenshot(path="/tmp/chatbox-knowledge.png")

    # Another turn, so the question is far above by the time search opens it.
    send(page, "Thanks! Now write a long poem about the sea, with many verses.")
    wait_answer(page, 2)


def test_memory_page_add_edit_switch_delete(server: LiveServer, page: Any) -> None:  # noqa: F811
    page.goto(server.url + "/")
    page.locator(".sidebar-foot a", has_text="Memory").click()
    page.wait_for_url("**/memory")
    page.on("dialog", lambda d: d.accept())
    page.fill("#new-fact", "My favourite tea is smoky lapsang")
    page.get_by_role("button", name="Remember").click()
    box = page.wait_for_selector(".fact input[name=text]")
    assert box.input_value() == "My favourite tea is smoky lapsang"
    assert page.locator("#new-fact").input_value() == ""
    box.fill("My favourite tea is jasmine")
    page.locator(".fact button", has_text="Save").click()
    page.wait_for_selector("#memory-list .notice:has-text('Saved')")
    assert page.locator(".fact input[name=text]").input_value() == "My favourite tea is jasmine"
    page.get_by_label("Use memory in my conversations").uncheck()
    page.wait_for_selector("#memory-list .notice:has-text('Memory is off')")
    page.screenshot(path="/tmp/chatbox-knowledge-memory.png")
    page.get_by_label("Use memory in my conversations").check()
    page.wait_for_selector("#memory-list .notice:has-text('Memory is on')")
    page.get_by_label("Delete this fact").click()
    page.wait_for_selector("#memory-list:has-text('Nothing remembered yet')")
    page.reload()
    assert page.locator(".fact").count() == 0
    assert page.get_by_label("Use memory in my conversations").is_checked()


def test_search_opens_the_conversation_at_the_turn(server: LiveServer, page: Any) -> None:  # noqa: F811
    page.goto(server.url + "/")
    if page.locator(".conv-item").count() == 0:  # run on its own
        send(page, QUESTION)
        wait_answer(page, 1)
        send(page, "Now write a long poem about the sea, with many verses.")
        wait_answer(page, 2)
        page.goto(server.url + "/")
    page.fill("#search-q", "spare key")
    try:
        hit = page.wait_for_selector(".search-hit:has(mark)", timeout=60_000)
    except Exception:
        page.screenshot(path="/tmp/chatbox-knowledge-search-fail.png")
        raise AssertionError(page.inner_html("#search-results")) from None
    assert "spare" in hit.inner_text().lower()
    page.screenshot(path="/tmp/chatbox-knowledge-search.png")
    hit.click()
    page.wait_for_url("**/c/**")
    turn = page.wait_for_selector(".turn.hit")
    assert page.url.endswith("#" + turn.get_attribute("id"))
    # The hit may be an answer that words it differently ("Spare key", "key ... spare").
    text = turn.inner_text().lower()
    assert turn.is_visible() and "spare" in text and "key" in text
    assert turn.query_selector("mark") is not None
    top, height = page.evaluate(
        "() => [document.querySelector('.turn.hit mark').getBoundingClientRect().top,"
        " window.innerHeight]"
    )
    assert 0 <= top < height, f"the matched words are not in view ({top}px of {height})"
    page.screenshot(path="/tmp/chatbox-knowledge-hit.png")


def test_library_upload_list_and_delete(
    server: LiveServer,  # noqa: F811
    page: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    note, empty = note_files(tmp_path, "library-notes.md")
    page.goto(server.url + "/")
    page.locator(".sidebar-foot a", has_text="Library").click()
    page.wait_for_url("**/library")
    page.on("dialog", lambda d: d.accept())

    # A refused file says why, inline, and lists nothing.
    page.set_input_files("#library-file", str(empty))
    page.get_by_role("button", name="Upload").click()
    alert = page.wait_for_selector("#alerts .alert").inner_text()
    assert "empty.md is empty" in alert, alert
    assert page.locator(".library-doc").count() == 0

    page.set_input_files("#library-file", str(note))
    page.get_by_role("button", name="Upload").click()
    row = page.wait_for_selector(".library-doc:has-text('library-notes.md')")
    assert "1 passage" in row.inner_text()
    assert page.locator("#alerts .alert").count() == 0  # a success clears the old alert
    assert page.locator("#library-file").input_value() == ""
    page.screenshot(path="/tmp/chatbox-knowledge-library.png")
    page.reload()
    assert page.locator(".library-doc", has_text="library-notes.md").count() == 1

    page.get_by_label("Delete library-notes.md").click()
    page.wait_for_selector("#library-list:has-text('Your library is empty')")
    page.reload()
    assert page.locator(".library-doc").count() == 0
