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
