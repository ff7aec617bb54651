"""The chat's extras in headless Chromium against `chatbox serve` (the tiny model): copy
buttons (code blocks, messages, share links), math typeset by KaTeX under the strict CSP,
starter prompts, renaming and deleting from the sidebar, the light/dark choice, the "memory
updated" note, and who wrote each message of a workspace conversation.

Run: pytest -m browser tests/web/test_chat_extras_browser.py
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.served import Served
from tests.web.test_browser import browser, watch_csp  # noqa: F401

pytestmark = [
    pytest.mark.browser,
    pytest.mark.store_agnostic("the chat page's controls in a browser"),
]
DONE = "#turns > .turn.assistant[data-status]:not(.streaming)"
CODE = 'print("otters hold hands")'
ANSWER = (
    f"Here is the code:\n\n```python\n{CODE}\n```\n\n"
    "A thin space: $a\\,b$, and a display: $$\\frac{1}{2}\\,\\text{cm}$$"
)
QUESTION = "Show me some code and some math."
KEYS: dict[str, str] = {}  # API keys of the module's people, by name


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Served]:
    env = {"CHATBOX_MAX_TOKENS": "24"}  # the tiny model's random text: short answers
    with Served(tmp_path_factory.mktemp("extras"), model=tiny_gguf, env=env) as served:
        KEYS.update({name: served.user(name, tier="paid") for name in ("ann", "bo")})
        yield served


def key(box: Served, name: str) -> dict[str, str]:
    return box.auth(KEYS[name])


def api(box: Served, name: str, method: str, path: str, **kwargs: Any) -> Any:
    headers = box.admin if name == "admin" else key(box, name)
    r = httpx.request(method, box.url + path, headers=headers, timeout=120, **kwargs)
    assert r.status_code < 300, r.text[:500]
    return r.json() if r.content else None


def imported(box: Served, name: str, title: str, question: str, answer: str) -> str:
    """A conversation brought in as a ChatGPT export: a fixed answer, unlike the model's."""

    def node(role: str, text: str, parent: str, children: list[str]) -> dict[str, Any]:
        message = {"author": {"role": role}, "content": {"content_type": "text", "parts": [text]}}
        return {"message": message, "parent": parent, "children": children}

    export = [
        {
            "title": title,
            "create_time": 1_700_000_000.0,
            "update_time": 1_700_000_100.0,
            "current_node": "b",
            "mapping": {
                "r": {"message": None, "parent": None, "children": ["a"]},
                "a": {"id": "a", **node("user", question, "r", ["b"])},
                "b": {"id": "b", **node("assistant", answer, "a", [])},
            },
        }
    ]
    files = {"file": ("conversations.json", json.dumps(export).encode())}
    api(box, name, "POST", "/v1/users/me/import", files=files)
    convs = api(box, name, "GET", "/v1/conversations")
    convs = convs["data"] if isinstance(convs, dict) else convs
    return str(next(c["id"] for c in convs if c["title"] == title))


@pytest.fixture
def session(box: Served, browser: Any) -> Iterator[Any]:  # noqa: F811
    """A factory of logged-in pages (a fresh context each, clipboard allowed); every page
    must end without a script error or a CSP violation."""
    contexts: list[Any] = []
    problems: list[list[str]] = []

    def open_as(name: str) -> Any:
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        context.grant_permissions(["clipboard-read", "clipboard-write"], origin=box.url)
        contexts.append(context)
        pg = context.new_page()
        pg.set_default_timeout(30_000)
        errors: list[str] = []
        pg.on("pageerror", lambda exc: errors.append(str(exc)))
        problems.extend([errors, watch_csp(pg)])
        pg.goto(box.url + "/login")
        pg.fill("input[name=name]", name)
        pg.fill("input[name=password]", name * 2)
        pg.click("button[type=submit]")
        pg.wait_for_selector("#composer-input")
        return pg

    yield open_as
    for context in contexts:
        context.close()
    assert not any(problems), problems


def clipboard(pg: Any) -> str:
    return str(pg.evaluate("navigator.clipboard.readText()"))


def test_copy_buttons_and_math(box: Served, session: Any) -> None:
    conv = imported(box, "ann", "Code and math", QUESTION, ANSWER)
    pg = session("ann")
    pg.goto(f"{box.url}/c/{conv}")
    answer = pg.locator(DONE)

    # Math: typeset by KaTeX, its TeX intact (Markdown would have eaten "\,"), fonts served.
    assert answer.locator(".katex").count() == 2
    tex = answer.locator(".math-inline annotation[encoding='application/x-tex']")
    assert tex.text_content() == "a\\,b"
    shown = answer.locator(".math-display annotation[encoding='application/x-tex']")
    assert shown.text_content() == "\\frac{1}{2}\\,\\text{cm}"
    fonts = pg.evaluate(
        "async () => { await document.fonts.ready;"
        " return [...document.fonts].filter(f => f.family.includes('KaTeX')"
        " && f.status === 'loaded').length }"
    )
    assert fonts > 0

    # The code block's Copy button copies the code alone; the message's, the message.
    answer.locator("pre .copy-code").click()
    assert clipboard(pg).strip() == CODE
    assert answer.locator("pre .copy-code").inner_text() == "Copied"
    pg.hover(".turn.user .bubble")
    pg.click(".turn.user button[aria-label='Copy message']")
    assert clipboard(pg) == QUESTION
    pg.click(f"{DONE} button[aria-label='Copy answer']")
    copied = clipboard(pg)
    assert CODE in copied and "$a\\,b$" in copied and "Copy" not in copied

    # A new share link has its own Copy button.
    pg.click("summary[aria-label=Share]")
    pg.click("#share-panel button:has-text('Create a link')")
    url = pg.input_value("[data-testid=share-url]")
    pg.click("#share-panel button[aria-label='Copy link']")
    assert clipboard(pg) == url and url.startswith(box.url + "/s/")


def test_starter_prompt_then_rename_and_delete_from_the_sidebar(box: Served, session: Any) -> None:
    other = imported(box, "ann", "Other chat", "Hello there", "Hi.")
    pg = session("ann")
    pg.goto(box.url + "/")
    starter = pg.locator(".starter").first
    prompt = starter.get_attribute("data-prompt")
    assert pg.locator(".starter").count() >= 3 and prompt
    starter.click()
    pg.wait_for_selector(DONE, timeout=120_000)
    assert pg.locator("#turns .turn.user .plain").inner_text() == prompt
    assert "/c/" in pg.url
    current = pg.url.rsplit("/", 1)[-1]

    # Rename another chat from its menu: the sidebar says so, the open chat stays as it is.
    row = pg.locator(".conv-row", has=pg.locator(f"a[href='/c/{other}']"))
    row.hover()
    row.locator("summary[aria-label='Options for Other chat']").click()
    row.get_by_role("button", name="Rename").click()
    row.locator("input[name=title]").fill("Renamed chat")
    row.get_by_role("button", name="Save").click()
    pg.wait_for_selector(f"#conv-list a[href='/c/{other}'] >> text=Renamed chat")
    assert pg.url.endswith(current) and pg.locator(".chat-title").inner_text() != "Renamed chat"

    # Rename the open chat: its header follows.
    row = pg.locator(".conv-row.active")
    row.hover()
    row.locator("summary").click()
    row.get_by_role("button", name="Rename").click()
    row.locator("input[name=title]").fill("Starter chat")
    row.locator("input[name=title]").press("Enter")
    pg.wait_for_selector(".chat-title >> text=Starter chat")

    # Delete another chat: asked first; the dialog says stated facts stay in memory.
    row = pg.locator(".conv-row", has=pg.locator(f"a[href='/c/{other}']"))
    row.hover()
    row.locator("summary").click()
    row.get_by_role("button", name="Delete").click()
    dialog = pg.wait_for_selector("#side-dialog [role=alertdialog]")
    note = dialog.query_selector("[data-testid=delete-memory-note]")
    assert note is not None and "remember" in note.inner_text()
    assert note.query_selector("a[href='/memory']") is not None
    dialog.query_selector("button:has-text('Delete')").click()  # type: ignore[union-attr]
    pg.wait_for_selector(f"#conv-list a[href='/c/{other}']", state="detached")
    assert pg.url.endswith(current) and pg.locator("#side-dialog [role=alertdialog]").count() == 0
    r = httpx.get(f"{box.url}/v1/conversations/{other}", headers=key(box, "ann"), timeout=60)
    assert r.status_code == 404

    # Delete the open chat from the sidebar: back to a new chat.
    row = pg.locator(".conv-row.active")
    row.hover()
    row.locator("summary").click()
    row.get_by_role("button", name="Delete").click()
    with pg.expect_navigation():
        pg.click("#side-dialog button.btn-danger")
    assert pg.url.rstrip("/") == box.url
    assert pg.locator(f"#conv-list a[href='/c/{current}']").count() == 0


PARSED = """
document.addEventListener("readystatechange", () => {
  if (document.readyState === "interactive")  // parsed; deferred scripts have not run yet
    window.__themeAtParse = document.documentElement.dataset.theme || "";
});
"""


def test_dark_theme_is_remembered_without_a_flash(box: Served, session: Any) -> None:
    pg = session("ann")
    pg.add_init_script(PARSED)
    pg.goto(box.url + "/")
    pg.select_option("select[data-action=theme]", "dark")
    assert pg.evaluate("document.documentElement.dataset.theme") == "dark"
    background = "getComputedStyle(document.body).backgroundColor"
    assert pg.evaluate(background) == "rgb(21, 23, 27)"
    pg.reload()
    assert pg.evaluate("window.__themeAtParse") == "dark"  # before the first paint
    assert pg.input_value("select[data-action=theme]") == "dark"
    pg.select_option("select[data-action=theme]", "light")
    pg.reload()
    assert pg.evaluate("window.__themeAtParse") == "light"
    assert pg.evaluate(background) == "rgb(255, 255, 255)"
    pg.select_option("select[data-action=theme]", "system")
    assert pg.evaluate("document.documentElement.dataset.theme") is None
    assert pg.evaluate("localStorage.getItem('chatbox-theme')") == "system"


def test_a_stated_fact_says_memory_was_updated(box: Served, session: Any) -> None:
    pg = session("bo")
    pg.goto(box.url + "/")
    pg.fill("#composer-input", "Remember that my favourite colour is teal.")
    pg.press("#composer-input", "Enter")
    pg.wait_for_selector(DONE, timeout=120_000)
    note = pg.locator(f"{DONE} [data-testid=memory-note]")
    note.wait_for(timeout=120_000)  # the extraction finishes after the answer, later under load
    assert "favourite colour is teal" in note.inner_text()
    assert note.locator("a[href='/memory']").count() == 1
    facts = api(box, "bo", "GET", "/v1/users/me/memory")
    facts = facts["data"] if isinstance(facts, dict) else facts
    assert any("teal" in f["text"] for f in facts)
    # An ordinary message says nothing of memory.
    pg.fill("#composer-input", "What is a good name for a boat?")
    pg.press("#composer-input", "Enter")
    pg.locator(DONE).nth(1).wait_for(timeout=120_000)
    assert pg.locator("[data-testid=memory-note]").count() == 1


def test_a_workspace_chat_names_its_writers_and_starts_in_the_workspace(
    box: Served, session: Any
) -> None:
    ws = api(box, "admin", "POST", "/v1/workspaces", json={"name": "Support"})["id"]
    api(box, "admin", "POST", f"/v1/workspaces/{ws}/members", json={"name": "ann", "role": "owner"})
    api(box, "ann", "POST", f"/v1/workspaces/{ws}/members", json={"name": "bo"})
    pg = session("ann")
    pg.goto(f"{box.url}/w/{ws}")
    pg.click("[data-testid=ws-new-chat]")
    pg.wait_for_selector("#composer-input")
    assert pg.locator(".chat-head [data-testid=conv-workspace]").inner_text().strip() == "Support"
    pg.fill("#composer-input", "Ann opens the ticket.")
    pg.press("#composer-input", "Enter")
    pg.wait_for_selector(DONE, timeout=120_000)
    conv = pg.url.rsplit("/", 1)[-1]
    assert pg.locator(".chat-head [data-testid=conv-workspace]").inner_text().strip() == "Support"

    # A teammate continues it (through the API); the starter sees who wrote what.
    with httpx.stream(
        "POST",
        f"{box.url}/v1/conversations/{conv}/turns",
        headers=key(box, "bo"),
        json={"content": "Bo adds a detail."},
        timeout=120,
    ) as r:
        assert r.status_code < 300  # a member of its workspace: it is in there
        r.read()
    pg.reload()
    authors = pg.locator("#turns .turn.user [data-testid=turn-author]").all_inner_texts()
    assert [a.replace("Written by", "").strip() for a in authors] == ["You", "bo"]
    page_of_bo = session("bo")
    page_of_bo.goto(f"{box.url}/c/{conv}")
    authors = page_of_bo.locator("#turns .turn.user [data-testid=turn-author]").all_inner_texts()
    assert [a.replace("Written by", "").strip() for a in authors] == ["ann", "You"]
