"""Share links and workspaces in headless Chromium against the real default model
(SmolLM2-135M): a shared chat opens in a fresh anonymous browser, deleting it asks about
its link; an admin creates a workspace in the console, its owner adds a member and moves a
chat in, and the workspace page shows both members, the chat and the library.

Run: pytest -m browser tests/web/test_teams_browser.py
Screenshots: share.png and workspace.png (the README's; scripts/screenshots.sh refreshes them), and
/tmp/chatbox-share-panel.png, /tmp/chatbox-delete-dialog.png, /tmp/chatbox-moved.png
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LiveServer, on_smollm2, seed_user
from tests.web.test_browser import SHOTS, browser, login, page, send, watch_csp  # noqa: F401

pytestmark = pytest.mark.browser
PASSWORDS = {"owen": "owen-password-1", "mia": "mia-password-1"}
DONE = "#turns > .turn.assistant[data-status]:not(.streaming)"
QUESTION = "Write two short sentences about sea otters."


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    data_dir: Path = tmp_path_factory.mktemp("teams") / "data"
    settings, registry = on_smollm2(data_dir, max_tokens=60, heartbeat_s=5.0)
    for name, password in PASSWORDS.items():
        seed_user(settings, name, role="member", tier="paid", password=password)
    with LiveServer(settings, registry) as live:
        yield live


def log_in(browser: Any, server: LiveServer, name: str) -> tuple[Any, list[str]]:  # noqa: F811
    """A fresh browser context logged in as `name`: its page and its CSP violations."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = context.new_page()
    pg.set_default_timeout(30_000)
    violations = watch_csp(pg)
    pg.goto(server.url + "/login")
    pg.fill("input[name=name]", name)
    pg.fill("input[name=password]", PASSWORDS[name])
    pg.click("button[type=submit]")
    pg.wait_for_selector("#composer-input")
    return pg, violations


def ask(pg: Any, server: LiveServer, text: str) -> None:
    """Start a chat with `text` and wait for the whole answer."""
    pg.goto(server.url + "/")
    send(pg, text)
    pg.wait_for_selector(DONE, timeout=120_000)


def test_a_shared_chat_opens_in_a_fresh_anonymous_browser(
    server: LiveServer,
    browser: Any,  # noqa: F811
    page: Any,  # noqa: F811
) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    ask(page, server, QUESTION)
    answer = page.inner_text(f"{DONE} .md").strip()
    assert answer
    page.click("summary[aria-label=Share]")
    page.click("#share-panel button:has-text('Create a link')")
    url = page.input_value("[data-testid=share-url]")
    assert url.startswith(server.url + "/s/"), url
    assert page.locator(".share-link").count() == 1
    page.screenshot(path="/tmp/chatbox-share-panel.png")

    # A fresh context: no cookie, no account.
    anon = browser.new_context(viewport={"width": 1100, "height": 760})
    reader = anon.new_page()
    violations = watch_csp(reader)
    errors: list[str] = []
    reader.on("pageerror", lambda exc: errors.append(str(exc)))
    response = reader.goto(url)
    assert response is not None and response.status == 200
    assert reader.locator(".share-turns .turn.user").inner_text().strip() == QUESTION
    shown = reader.locator(".share-turns .turn.assistant .md").inner_text().strip()
    assert shown == answer
    assert reader.locator("#sidebar, #composer, .user-chip").count() == 0  # nothing of the owner
    robots = reader.locator("meta[name=robots]").get_attribute("content")
    assert robots is not None and robots.startswith("noindex")
    assert reader.get_by_role("link", name="Continue this conversation").is_visible()
    reader.screenshot(path=str(SHOTS / "share.png"), full_page=True)

    # Deleting the chat asks about its link; keeping it leaves the snapshot readable.
    page.click("summary[aria-label='Chat settings']")
    page.click("button:has-text('Delete chat')")
    dialog = page.wait_for_selector("[role=alertdialog]")
    assert "1 live share link" in dialog.inner_text()
    assert page.evaluate("document.activeElement.textContent") == "Delete and revoke links"
    page.screenshot(path="/tmp/chatbox-delete-dialog.png")
    with page.expect_navigation():
        page.click("button:has-text('Delete, keep links')")
    assert page.url.rstrip("/") == server.url
    reader.reload()
    assert reader.locator(".share-turns .turn.user").inner_text().strip() == QUESTION
    anon.close()
    assert not errors and not violations, (errors, violations)


def test_a_workspace_with_two_members_and_a_conversation(
    server: LiveServer,
    browser: Any,  # noqa: F811
    page: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    # The admin creates the workspace in the console and names its owner.
    page.goto(server.url + "/console/workspaces")
    page.fill("#new-workspace input[name=name]", "Support")
    page.select_option("#new-workspace select[name=owner]", "owen")
    page.click("#new-workspace button[type=submit]")
    page.wait_for_selector("text=Created Support, owned by owen.")

    # The owner finds it in the sidebar and adds a member on its page.
    owen, owen_csp = log_in(browser, server, "owen")
    owen.click(".ws-list a:has-text('Support')")
    owen.wait_for_selector("h1:has-text('Support')")
    owen.fill("#ws-add-name", "mia")
    owen.click("form.ws-add button[type=submit]")
    owen.wait_for_selector(".ws-members li:has-text('mia')")

    # A chat of owen's moves in from its settings; header and sidebar say where it lives.
    ask(owen, server, "Draft a short reply to a customer whose pump will not start.")
    owen.click("summary[aria-label='Chat settings']")
    owen.select_option("select[name=workspace_id]", label="Support")
    chip = owen.wait_for_selector("[data-testid=conv-workspace]")
    assert chip.inner_text().strip() == "Support"
    assert owen.locator("#conv-list .conv-item.in-workspace .conv-ws").count() == 1
    owen.screenshot(path="/tmp/chatbox-moved.png")

    # The workspace's library, from its page.
    note = tmp_path / "pump-runbook.md"
    note.write_text("# Pump runbook\n\nHold the red lever for ten seconds to restart the pump.\n")
    chip.click()
    owen.wait_for_selector("h1:has-text('Support')")
    owen.set_input_files("#library-file", str(note))
    owen.click("#library-upload button[type=submit]")
    owen.wait_for_selector("text=Added pump-runbook.md.")

    # Mia, the other member, sees the same conversation on the page.
    mia, mia_csp = log_in(browser, server, "mia")
    mia.click(".ws-list a:has-text('Support')")
    mia.wait_for_selector(".ws-convs li")
    assert mia.locator(".ws-convs li").count() == 1
    assert "started by owen" in mia.locator(".ws-convs li").inner_text()
    mia.click(".ws-convs a")
    mia.wait_for_selector(DONE)
    assert mia.locator("[data-testid=conv-workspace]").inner_text().strip() == "Support"

    owen.reload()
    members = owen.locator(".ws-members li").all_inner_texts()
    assert len(members) == 2 and "owen" in members[0] and "mia" in members[1]
    assert owen.locator(".ws-convs li").count() == 1
    assert owen.locator(".library-doc-name").inner_text() == "pump-runbook.md"
    owen.screenshot(path=str(SHOTS / "workspace.png"), full_page=True)
    assert not owen_csp and not mia_csp, (owen_csp, mia_csp)
