"""The web UI in headless Chromium against the real default model (SmolLM2-135M).

Run: pytest -m browser tests/web/test_browser.py
Screenshots: /tmp/chatbox-ui.png (desktop) and /tmp/chatbox-ui-phone.png (390x844).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ADMIN_NAME, ADMIN_PASSWORD, LiveServer, on_smollm2

pytestmark = [
    pytest.mark.browser,
    pytest.mark.store_agnostic("the chat page in a browser, streaming and on a phone"),
]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
# Screenshots go to a temporary directory: a test run never touches tracked files.
# scripts/screenshots.sh points this at docs/screenshots to refresh the docs' on purpose.
SHOTS = Path(
    os.environ.get("CHATBOX_SCREENSHOTS") or Path(tempfile.gettempdir()) / "chatbox-screenshots"
)
STORY = "Write a very long story about a dragon who learns to bake bread. Make it detailed."


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    data_dir: Path = tmp_path_factory.mktemp("ui") / "data"
    # One llama.cpp thread: Chromium renders on the same two cores here (a user's browser
    # runs on their own machine). With two OpenMP threads, the browser and two busy loops
    # beside this module, single-token steps took up to 3 s (a thread waits at a barrier
    # for one the kernel descheduled), and a stop waits for the step in flight to end.
    settings, registry = on_smollm2(
        data_dir,
        max_tokens=400,
        heartbeat_s=5.0,
        disconnect_grace_s=2.0,
        draft_flush_s=0.5,
        n_threads=1,
    )
    with LiveServer(settings, registry) as live:
        yield live


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    executable = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    if executable is None:
        pytest.skip("no chromium to drive")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def login(server: LiveServer, browser: Any) -> dict[str, Any]:
    """A logged-in browser state (the session cookie), shared by the tests."""
    context = browser.new_context()
    try:
        pg = context.new_page()
        pg.goto(server.url + "/")
        if "/login" in pg.url:
            pg.fill("input[name=name]", ADMIN_NAME)
            pg.fill("input[name=password]", ADMIN_PASSWORD)
            pg.click("button[type=submit]")
            pg.wait_for_selector("#composer-input")
        state: dict[str, Any] = context.storage_state()
        return state
    finally:
        context.close()


@pytest.fixture
def page(browser: Any, login: dict[str, Any]) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800}, storage_state=login)
    pg = context.new_page()
    pg.set_default_timeout(30_000)
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    violations = watch_csp(pg)
    yield pg
    context.close()
    assert not errors, errors
    assert not violations, f"Content-Security-Policy violations: {violations}"


CSP_WATCH = """
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolation(`${e.effectiveDirective} blocked ${e.blockedURI || "inline"}`
                        + ` at ${e.sourceFile || location.pathname}:${e.lineNumber} ${e.sample}`);
});
"""


def watch_csp(pg: Any) -> list[str]:
    """Every CSP violation the page reports, across navigations."""
    violations: list[str] = []
    pg.expose_function("__cspViolation", lambda text: violations.append(str(text)))
    pg.add_init_script(CSP_WATCH)
    return violations


def answer_text(page: Any) -> str:
    return str(
        page.evaluate(
            "() => { const m = document.querySelector('.turn.assistant:last-of-type .md');"
            " return m ? m.innerText : '' }"
        )
    )


def words(text: str) -> list[str]:
    """The words of rendered text, without Markdown marks or numbers.

    Partial Markdown renders differently from the finished answer (a lone "-" or "1." is text
    until the list item exists), so streamed and final text are compared by their words.
    """
    return re.findall(r"[^\W\d_]+", text)  # list numbers turn into <ol> markers


def kept(seen: str, final: str) -> bool:
    """Whether every complete word seen while streaming is in the final answer, in order."""
    expected = words(seen)[:-1]  # the last word may still have been growing
    return words(final)[: len(expected)] == expected


def last_status(page: Any) -> str | None:
    return page.evaluate(
        "() => { const t = document.querySelector('#turns > .turn.assistant:last-of-type');"
        " return t ? t.dataset.status : null }"
    )


def signed_in(browser: Any, url: str, name: str, password: str) -> tuple[Any, list[str]]:
    """A desktop page signed in as `name` on the chat page, and the list its page errors
    are collected in."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(url + "/login")
    page.fill("input[name=name]", name)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_selector("#composer-input", timeout=120_000)
    return page, errors


def send(page: Any, text: str) -> None:
    page.fill("#composer-input", text)
    page.press("#composer-input", "Enter")


FINAL = "#turns > .turn.assistant[data-status]:not(.streaming)"


def mark_answers(page: Any) -> None:
    """Mark the answers on the page now, so `wait_new_answer` waits for one made after."""
    page.evaluate(
        "() => document.querySelectorAll('.turn.assistant').forEach(t => t.dataset.seen = '1')"
    )


def wait_new_answer(page: Any, timeout: int = 60_000) -> None:
    """Wait for a finished answer that was not on the page at `mark_answers`.

    Waiting for the streaming bubble first would race: a short answer from the tiny model can
    stream and finish between two of Playwright's polls, so only the final bubble is awaited.
    """
    page.wait_for_selector(FINAL + ":not([data-seen])", timeout=timeout)


def test_reply_streams_in_steps_and_renders(server: LiveServer, page: Any) -> None:
    page.goto(server.url + "/")
    # Record the streaming bubble's text at every DOM change, so no frame is missed however
    # fast or slow the machine is (polling from here could miss a quick answer's frames).
    page.evaluate(
        "() => { window.__growth = []; new MutationObserver(() => {"
        " const m = document.querySelector('.turn.assistant.streaming .md');"
        " if (m) window.__growth.push(m.innerText); })"
        ".observe(document.body, {subtree: true, childList: true, characterData: true}); }"
    )
    send(page, "Say hello, then name three colors as a bulleted list with one sentence on each.")
    wait_new_answer(page)
    snapshots: list[str] = page.evaluate("() => window.__growth")
    growing = sorted({len(t) for t in snapshots if t})
    assert len(growing) >= 2, f"the reply did not grow in steps: {snapshots}"
    assert last_status(page) == "complete"
    final = answer_text(page)
    assert final.strip()
    assert all(kept(t, final) for t in snapshots), (snapshots, final)
    # The URL is now the conversation's; the sidebar lists it, titled by the first message.
    assert "/c/" in page.url
    assert page.locator(".conv-item.active").inner_text().startswith("Say hello")
    assert page.locator("#composer-input").input_value() == ""
    used = page.locator("#context-meter .meter-text").inner_text()
    assert used.endswith("tokens") and not used.startswith("0 ")


def test_stop_keeps_partial_answer_marked_stopped(server: LiveServer, page: Any) -> None:
    page.goto(server.url + "/")
    send(page, STORY)
    page.wait_for_selector(".turn.assistant.streaming")
    page.wait_for_function(
        "() => { const m = document.querySelector('.turn.streaming .md');"
        " return m && m.innerText.length > 40 }"
    )
    # Sending while it streams is refused with a friendly inline message.
    send(page, "another question")
    alert = page.wait_for_selector("#alerts .alert")
    assert "Still writing" in alert.inner_text()
    assert page.locator("#composer-input").input_value() == "another question"

    seen = answer_text(page)
    assert page.locator(".composer .stop").is_visible()
    started = time.monotonic()
    page.locator(".composer .stop").click()
    page.wait_for_selector("#turns > .turn.assistant[data-status=stopped]", timeout=5_000)
    elapsed = time.monotonic() - started
    assert elapsed < 1.5, f"stopping took {elapsed:.2f}s"
    assert kept(seen, answer_text(page)), "the partial answer did not stay"
    assert page.locator(".turn.assistant .badge").last.inner_text().lower() == "stopped"
    # The send button comes back once the streaming bubble has been replaced (the stopped
    # status can land a frame before the swap that ends the streaming state).
    page.wait_for_selector(".composer .send", state="visible", timeout=2_000)
    page.screenshot(path="/tmp/chatbox-ui.png")

    # A reload shows the conversation in the sidebar and its turns.
    url = page.url
    page.reload()
    assert page.url == url
    assert page.locator(".conv-item.active").inner_text().startswith("Write a very long story")
    assert page.locator(".turn.user .plain").first.inner_text() == STORY
    stopped = page.locator("#turns > .turn.assistant[data-status=stopped]")
    assert stopped.count() == 1 and kept(seen, stopped.locator(".md").inner_text())


def test_regenerate_creates_a_branch_and_switches(server: LiveServer, page: Any) -> None:
    page.goto(server.url + "/")
    send(page, "Name one fruit.")
    wait_new_answer(page)
    mark_answers(page)
    page.locator("#turns > .turn.assistant .regen").last.click()
    wait_new_answer(page)
    assert page.locator(".turn.assistant .branch-pos").inner_text() == "2/2"
    page.get_by_label("Previous version").click()
    page.wait_for_function(
        "() => document.querySelector('.turn.assistant .branch-pos')?.innerText === '1/2'"
    )
    # Editing the question makes a sibling of it, too.
    mark_answers(page)
    page.locator(".turn.user button[aria-label='Edit message']").click()
    box = page.wait_for_selector(".edit-form textarea")
    box.fill("Name one vegetable.")
    box.press("Enter")
    wait_new_answer(page)
    assert page.locator(".turn.user .branch-pos").inner_text() == "2/2"
    assert page.locator(".turn.user .plain").inner_text() == "Name one vegetable."


def test_the_ui_works_under_a_strict_csp(
    server: LiveServer, browser: Any, login: dict[str, Any]
) -> None:
    """Send, stream, stop, edit, switch branches, search, memory and library: no violation."""
    context = browser.new_context(viewport={"width": 1280, "height": 800}, storage_state=login)
    pg = context.new_page()
    pg.set_default_timeout(30_000)
    violations = watch_csp(pg)
    try:
        response = pg.goto(server.url + "/")
        csp = response.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe" not in csp
        # the watch works: a style attribute made by script is refused and reported
        pg.evaluate(
            "() => { const d = document.createElement('div');"
            " d.innerHTML = '<p style=\"color: red\">x</p>'; document.body.append(d); }"
        )
        deadline = time.monotonic() + 5
        while not violations and time.monotonic() < deadline:
            pg.wait_for_timeout(50)
        assert violations and "style-src" in violations[0], violations
        violations.clear()

        send(pg, STORY)
        pg.wait_for_selector(".turn.assistant.streaming")
        pg.wait_for_function(
            "() => { const m = document.querySelector('.turn.streaming .md');"
            " return m && m.innerText.length > 20 }"
        )
        pg.locator(".composer .stop").click()
        pg.wait_for_selector("#turns > .turn.assistant[data-status=stopped]", timeout=5_000)
        mark_answers(pg)
        pg.locator(".turn.user button[aria-label='Edit message']").click()
        box = pg.wait_for_selector(".edit-form textarea")
        box.fill("Name one vegetable.")
        box.press("Enter")
        wait_new_answer(pg)
        pg.get_by_label("Previous version").first.click()
        pg.wait_for_function(
            "() => document.querySelector('.turn.user .branch-pos')?.innerText === '1/2'"
        )
        pg.fill("#search-q", "dragon")
        pg.press("#search-q", "Enter")
        pg.wait_for_selector("#search-results a")
        pg.locator("#search-results a").first.click()
        pg.wait_for_selector(".turn.hit")
        for path in ("/memory", "/library"):
            pg.goto(server.url + path)
            pg.wait_for_load_state("networkidle")
        pg.goto(server.url + "/memory")
        pg.fill("#new-fact", "I like dragons")
        pg.locator(".memory-add button[type=submit]").click()
        pg.wait_for_function("() => document.querySelector('#new-fact').value === ''")
        assert pg.locator(".fact input[value='I like dragons']").count() == 1
    finally:
        context.close()
    assert not violations, f"Content-Security-Policy violations: {violations}"


def assert_no_sideways_scroll(pg: Any, width: int) -> None:
    scroll = pg.evaluate("document.documentElement.scrollWidth")
    wide = pg.evaluate(
        "w => [...document.querySelectorAll('body *')].filter(e =>"
        " e.getBoundingClientRect().right > w + 0.5 && !e.closest('pre, table, .sidebar'))"
        ".slice(0, 5).map(e => e.tagName + '.' + e.getAttribute('class'))",
        width,
    )
    assert scroll <= width and not wide, f"the page scrolls sideways ({scroll}px): {wide}"


def test_empty_message_and_phone_layout(
    server: LiveServer, browser: Any, login: dict[str, Any]
) -> None:
    context = browser.new_context(
        viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True, storage_state=login
    )
    pg = context.new_page()
    try:
        pg.goto(server.url + "/")
        pg.locator(".composer .send").click()  # nothing typed
        alert = pg.wait_for_selector("#alerts .alert").inner_text()
        assert "Type a message first" in alert, alert
        if pg.locator(".conv-item").count() == 0:  # run on its own: make a conversation
            send(pg, "Say hello.")
            wait_new_answer(pg)
        chat = pg.locator(".conv-item", has_text="Say hello").first
        pg.goto(server.url + chat.get_attribute("href"))
        pg.wait_for_selector("#turns > .turn.assistant")
        box = pg.locator("#sidebar").bounding_box()
        assert box["x"] + box["width"] <= 1, f"the sidebar is not collapsed: {box}"
        composer = pg.locator("#composer").bounding_box()
        assert composer["x"] >= 0 and composer["x"] + composer["width"] <= 390, composer
        assert_no_sideways_scroll(pg, 390)
        # A long chat on a large-context model: the header's token count grows, the page
        # must not (CI once saw 395px from a three-digit count).
        pg.evaluate(
            "() => { document.querySelector('.meter-text').textContent ="
            " '123,456 / 131,072 tokens' }"
        )
        assert_no_sideways_scroll(pg, 390)
        assert pg.locator("#settings summary").bounding_box()["x"] + 20 <= 390
        pg.screenshot(path="/tmp/chatbox-ui-phone.png")
        pg.get_by_label("Open conversations").click()
        pg.wait_for_function(
            "() => document.querySelector('#sidebar').getBoundingClientRect().x >= 0"
        )
        pg.screenshot(path="/tmp/chatbox-ui-phone-menu.png")
    finally:
        context.close()
