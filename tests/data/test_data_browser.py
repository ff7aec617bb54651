"""A temporary chat and the "Your data" page in headless Chromium (the tiny model), under
the app's strict Content-Security-Policy.

Run: pytest -m browser tests/data/test_data_browser.py
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chatbox.catalog.registry import ModelRegistry
from tests.conftest import ADMIN_NAME, ADMIN_PASSWORD, LiveServer, test_settings
from tests.data.test_import_served import chat
from tests.web.test_browser import browser, watch_csp  # noqa: F401  (a fixture)

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[LiveServer]:
    """The app on the tiny model, started before the browser (whose loop would stop the
    seeding's asyncio.run)."""
    data_dir = tmp_path_factory.mktemp("data-ui") / "data"
    registry = ModelRegistry(data_dir / "models", data_dir / "no-manifest.toml")
    registry.add(tiny_gguf, name="tiny", make_default=True, copy=False)
    with LiveServer(test_settings(data_dir), registry) as live:
        yield live


@pytest.fixture
def page(server: LiveServer, browser: Any) -> Iterator[Any]:  # noqa: F811
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = context.new_page()
    pg.set_default_timeout(30_000)
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    violations = watch_csp(pg)
    pg.goto(server.url + "/login")
    pg.fill("input[name=name]", ADMIN_NAME)
    pg.fill("input[name=password]", ADMIN_PASSWORD)
    pg.click("button[type=submit]")
    pg.wait_for_selector("#composer-input")
    yield pg
    context.close()
    assert not errors, errors
    assert not violations, f"Content-Security-Policy violations: {violations}"


def test_a_temporary_chat_streams_and_is_listed_nowhere(page: Any) -> None:
    page.click("text=Temporary chat")
    page.wait_for_url("**/temporary")
    page.fill("#composer-input", "hello from a temporary chat")
    page.keyboard.press("Enter")
    page.wait_for_selector(".turn.assistant[data-status=complete]")
    assert "/temporary/tmp_" in page.url
    page.fill("#composer-input", "one more")
    page.keyboard.press("Enter")
    page.locator(".turn.assistant[data-status=complete]").nth(1).wait_for()
    page.reload()
    assert page.locator(".turn.user").count() == 2  # in RAM for the hour, not in the history
    assert page.locator(".conv-item").count() == 0


def test_the_first_temporary_message_shows_once_and_stops_asking(
    server: LiveServer, page: Any
) -> None:
    """The first send swaps in the composer that sends to the new chat: the bubble shown
    while it was sent goes, and nothing is asked of the server after the answer."""
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url))
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.goto(server.url + "/temporary")
    page.fill("#composer-input", "hello once")
    page.keyboard.press("Enter")
    page.wait_for_selector(".turn.assistant[data-status=complete]", timeout=90_000)
    page.wait_for_timeout(2500)  # long enough for a stray poll (every second) to show
    assert page.locator(".turn.user").count() == 1
    assert page.locator(".turn.pending").count() == 0
    assert "Sending…" not in page.inner_text("#turns")
    assert not [u for u in asked if "/temporary/undefined" in u], asked
    assert not problems, problems
    # the answer can be copied, as in a stored chat
    assert page.locator(".turn.assistant [data-action=copy]").count() == 1
    assert page.locator(".turn.assistant .feedback").count() == 0  # no rating: see docs/ui.md


def test_the_data_page_says_what_is_kept(page: Any) -> None:
    page.click("text=Your data")
    page.wait_for_selector("#tier-keeps")
    assert "kept until you delete them" in page.inner_text("#tier-keeps")
    assert page.get_attribute("#export-link", "download") is not None
    page.fill("#delete-confirm", "not-my-name")
    page.click("#delete-form button")
    page.wait_for_selector("#alerts .alert")
    assert "account name" in page.inner_text("#alerts")


def test_an_import_says_what_came_in_where_a_phone_shows_it(
    server: LiveServer, page: Any, tmp_path: Path
) -> None:
    export = tmp_path / "conversations.json"
    export.write_text(json.dumps([chat("Otters", "How do otters sleep?")]))
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(server.url + "/settings/data")
    page.locator("#import-form").scroll_into_view_if_needed()
    page.set_input_files("#import-file", str(export))
    page.click("#import-form button[type=submit]")
    result = page.wait_for_selector("#import-result")
    assert "Imported 1 conversation" in result.inner_text()
    where = result.bounding_box()
    assert where and 0 <= where["y"] < 844, where  # on the screen, not above it
    # a success is not dressed as an error
    page.fill("#delete-confirm", "not-my-name")
    page.click("#delete-form button")
    error = page.wait_for_selector("#alerts .alert")
    looks = "(e) => getComputedStyle(e).backgroundColor + ' ' + getComputedStyle(e).color"
    assert result.evaluate(looks) != error.evaluate(looks)
    assert error.bounding_box()["y"] >= 0  # an error low on the page is scrolled to as well
