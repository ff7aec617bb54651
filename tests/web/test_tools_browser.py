"""An answer that used a library search and the code interpreter, in headless Chromium
under the app's strict Content-Security-Policy: both calls show in the answer's bubble,
collapsed, and open to their arguments and results (the tiny model, scripted through the
API's `tool_choice` to call them; the page is what a user then opens).

Run: pytest -m browser tests/web/test_tools_browser.py
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.served import Served
from tests.sse import parse_sse
from tests.web.test_browser import browser  # noqa: F401  (a fixture)
from tests.web.test_tools_served import DOC, QUESTION, SECRET, SEED, _policy

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Served]:
    where = tmp_path_factory.mktemp("tools-ui")
    env = {"CHATBOX_N_CTX": "32768", "CHATBOX_N_CTX_PER_SEQ": "8192"}
    with Served(where, model=tiny_gguf, policy=_policy(where / "policy"), env=env) as served:
        yield served


@pytest.mark.timeout(600)
def test_a_search_and_a_program_show_in_the_answer_bubble(
    box: Served,
    browser: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    http = httpx.Client(
        base_url=box.url, headers=box.auth(box.user("ann", tier="paid")), timeout=180
    )
    shelved = http.post("/v1/documents", files={"file": ("otters.txt", DOC)})
    assert shelved.status_code == 201, shelved.text
    conv = http.post("/v1/conversations", json={"title": "otters"}).json()["id"]
    body = {
        "content": QUESTION,
        "tool_choice": ["search_library", "run_python"],
        "max_tokens": 1500,
        "seed": SEED,
    }
    with http.stream("POST", f"/v1/conversations/{conv}/turns", json=body) as r:
        events = list(parse_sse(r.iter_lines()))
    assert events[-1].event == "done", events[-1]

    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(box.url + "/login")
    page.fill("input[name=name]", "ann")
    page.fill("input[name=password]", "annann")
    page.click("button[type=submit]")
    page.wait_for_selector("#composer-input")
    page.goto(f"{box.url}/c/{conv}")
    bubble = page.locator(".turn.assistant").last
    steps = bubble.locator(".tool-step")
    assert steps.count() == 2
    assert steps.nth(0).get_attribute("data-tool") == "search_library"
    assert steps.nth(1).get_attribute("data-tool") == "run_python"
    assert not steps.nth(0).locator(".tool-result").is_visible()  # collapsed
    steps.nth(0).locator("summary").click()
    assert SECRET in steps.nth(0).locator(".tool-result").inner_text()
    assert "otters.txt" in steps.nth(0).locator(".tool-citations").inner_text()
    steps.nth(1).locator("summary").click()
    assert steps.nth(1).locator(".tool-args").inner_text().strip().startswith("{")
    assert steps.nth(1).locator(".tool-result").is_visible()
    page.screenshot(path=str(tmp_path / "tools.png"))
    context.close()
    assert not errors, errors
