"""Thumbs on an answer in headless Chromium (the tiny model), under the app's strict
Content-Security-Policy: a click rates the answer, a comment can follow, and the rating is
still shown after a reload.

Run: pytest -m browser tests/web/test_feedback_browser.py
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.data.test_data_browser import page, server  # noqa: F401  (fixtures)
from tests.web.test_browser import browser  # noqa: F401  (a fixture)

pytestmark = pytest.mark.browser


@pytest.fixture
def answered(page: Any) -> Iterator[Any]:  # noqa: F811
    page.fill("#composer-input", "hello, rate me")
    page.keyboard.press("Enter")
    # Generous: the tiny model shares two cores with Chromium (and other tests).
    page.wait_for_selector(".turn.assistant[data-status=complete] .feedback", timeout=90_000)
    yield page


def test_thumbs_rate_an_answer_and_a_comment_follows(answered: Any, tmp_path: Path) -> None:
    pg = answered
    up = ".turn.assistant .feedback button[data-rating=up]"
    down = ".turn.assistant .feedback button[data-rating=down]"
    assert pg.get_attribute(up, "aria-pressed") == "false"
    pg.click(up)
    pg.wait_for_selector(f"{up}[aria-pressed=true]")
    assert pg.get_attribute(down, "aria-pressed") == "false"
    pg.fill(".feedback-comment input[name=comment]", "short and to the point")
    pg.click(".feedback-comment button[type=submit]")
    pg.wait_for_selector(".feedback-said")
    assert pg.locator(".feedback-comment").count() == 0
    pg.reload()
    pg.wait_for_selector(f"{up}[aria-pressed=true]")
    pg.click(down)  # changing one's mind: the newest rating counts
    pg.wait_for_selector(f"{down}[aria-pressed=true]")
    assert pg.get_attribute(up, "aria-pressed") == "false"
    pg.screenshot(path=str(tmp_path / "feedback.png"))


def test_on_a_phone_the_comment_box_opens_in_sight_above_the_composer(
    server: Any,  # noqa: F811
    browser: Any,  # noqa: F811
) -> None:
    from tests.data.test_data_browser import ADMIN_NAME, ADMIN_PASSWORD

    context = browser.new_context(
        viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True
    )
    pg = context.new_page()
    pg.set_default_timeout(30_000)
    try:
        pg.goto(server.url + "/login")
        pg.fill("input[name=name]", ADMIN_NAME)
        pg.fill("input[name=password]", ADMIN_PASSWORD)
        pg.click("button[type=submit]")
        pg.wait_for_selector("#composer-input")
        long = "Here is the background to my question, at some length. " * 12
        for n, text in enumerate((long + "A story?", long + "Another?")):
            pg.fill("#composer-input", text)
            pg.keyboard.press("Enter")
            done = ".turn.assistant[data-status] .feedback"  # ended, however
            pg.locator(done).nth(n).wait_for(state="attached", timeout=90_000)
        # The reader is at the bottom, the newest answer's thumbs just above the composer.
        pg.evaluate("document.querySelector('#scroll').scrollTop = 1e9")
        pg.locator(".turn.assistant .feedback button[data-rating=down]").last.tap()
        box = pg.locator(".feedback-comment").last
        box.wait_for()
        pg.wait_for_timeout(400)  # any smooth scroll has ended
        seen = pg.evaluate(
            """() => {
              const f = document.querySelectorAll('.feedback-comment');
              const r = f[f.length - 1].getBoundingClientRect();
              const s = document.querySelector('#scroll').getBoundingClientRect();
              const c = document.querySelector('#composer').getBoundingClientRect();
              return {top: r.top, bottom: r.bottom, scrollTop: s.top,
                      visibleBottom: Math.min(s.bottom, c.top, window.innerHeight)};
            }"""
        )
        assert seen["top"] >= seen["scrollTop"], seen
        assert seen["bottom"] <= seen["visibleBottom"] + 1, seen  # not under the composer
        assert pg.evaluate("document.activeElement.name") == "comment"  # ready to type
    finally:
        context.close()
