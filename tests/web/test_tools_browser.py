"""An answer that used a library search and the code interpreter, in headless Chromium
under the app's strict Content-Security-Policy: both calls show in the answer's bubble,
collapsed, and open to their arguments and results (the tiny model, scripted through the
API's `tool_choice` to call them; the page is what a user then opens).

Run: pytest -m browser tests/web/test_tools_browser.py
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.served import Served
from tests.sse import parse_sse
from tests.web.test_browser import (  # noqa: F401  (browser: a fixture)
    browser,
    mark_answers,
    send,
    signed_in,
    wait_new_answer,
)
from tests.web.test_tools_served import DOC, QUESTION, SECRET, SEED, UNSTUCK, _policy
from tests.web.test_ui_walk_browser import AXE

pytestmark = [
    pytest.mark.browser,
    pytest.mark.store_agnostic("how an answer's tool calls show in a browser"),
]
MCP_COMMAND = f"{sys.executable} {Path(__file__).parent.parent / 'chat' / 'mcp_server.py'}"


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Served]:
    where = tmp_path_factory.mktemp("tools-ui")
    # Answers from the UI (which sets no max_tokens) stay short.
    env = {"CHATBOX_N_CTX": "32768", "CHATBOX_N_CTX_PER_SEQ": "8192", "CHATBOX_MAX_TOKENS": "48"}
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
        **UNSTUCK,
    }
    with http.stream("POST", f"/v1/conversations/{conv}/turns", json=body) as r:
        events = list(parse_sse(r.iter_lines()))
    assert events[-1].event == "done", events[-1]

    page, errors = signed_in(browser, box.url, "ann", "annann")
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
    page.context.close()
    assert not errors, errors


@pytest.mark.timeout(600)
def test_an_mcp_servers_tool_is_used_in_a_chat_and_shows_in_the_bubble(
    box: Served,
    browser: Any,  # noqa: F811
) -> None:
    """An admin adds a real MCP server (tests/chat/mcp_server.py) with the CLI and marks its
    `add` read-only; a chat's answer calls it without asking, the sum comes back from the
    server, and the call shows in the bubble with its server's name."""
    added = box.cli("tools", "add", "calc", "--command", MCP_COMMAND)
    assert "add" in added
    box.cli("tools", "mark", "calc", "add", "--read-only")  # it runs without asking
    http = httpx.Client(
        base_url=box.url, headers=box.auth(box.user("mo", tier="paid")), timeout=180
    )
    conv = http.post("/v1/conversations", json={"title": "sums"}).json()["id"]
    body = {
        "content": "What is 2 + 3?",
        "tool_choice": ["calc__add"],
        "max_tokens": 600,
        "seed": SEED,
    }
    with http.stream("POST", f"/v1/conversations/{conv}/turns", json=body) as r:
        events = list(parse_sse(r.iter_lines()))
    assert events[-1].event == "done", events[-1]
    [call] = [e for e in events if e.event == "tool_call"]
    [result] = [e for e in events if e.event == "tool_result"]
    arguments = json.loads(call.data)["arguments"]
    expected = int(arguments["a"]) + int(arguments["b"])
    assert str(expected) in json.dumps(json.loads(result.data))

    page, errors = signed_in(browser, box.url, "mo", "momo")
    page.goto(f"{box.url}/c/{conv}")
    step = page.locator(".turn.assistant").last.locator(".tool-step")
    assert step.count() == 1 and step.get_attribute("data-tool") == "calc__add"
    step.locator("summary").click()
    assert str(expected) in step.locator(".tool-result").inner_text()
    page.context.close()
    assert not errors, errors


def _axe(page: Any) -> list[str]:
    """axe-core's WCAG 2.1 A/AA violations on the page as it is now."""
    page.evaluate(AXE.read_text() + "\n;0")
    found = page.evaluate(
        """async () => {
            const r = await axe.run(document, {runOnly: {type: 'tag',
                values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa']}});
            return r.violations.map(v => v.id + ': ' + v.nodes.map(n => n.target.join(' '))
                .slice(0, 4).join(' | '));
        }"""
    )
    return list(found)


def _ask(page: Any, text: str) -> str:
    """Send from the composer with the keyboard; the chat's id once the answer is done."""
    mark_answers(page)
    send(page, text)
    wait_new_answer(page, timeout=120_000)
    assert "/c/" in page.url, (page.url, page.locator("#alerts").inner_text())
    return str(page.url.rsplit("/c/", 1)[1].split("?")[0])


@pytest.mark.timeout(600)
def test_the_composers_tools_switch_offers_the_tools_in_that_chat(
    box: Served,
    browser: Any,  # noqa: F811
) -> None:
    """The Tools switch is off on a new chat; switched on with the keyboard, the chat's
    answers are asked with the tier's tools (their descriptions in the prompt), it stays on
    for that chat after a reload, and a chat without it is asked without them."""
    http = httpx.Client(
        base_url=box.url, headers=box.auth(box.user("kit", tier="paid")), timeout=180
    )
    page, errors = signed_in(browser, box.url, "kit", "kitkit")
    switch = page.get_by_role("switch", name="Tools")
    assert switch.is_visible() and not switch.is_checked()
    switch.focus()
    page.keyboard.press("Space")
    assert switch.is_checked()
    assert _axe(page) == []
    on = _ask(page, "Hello otters")
    assert page.get_by_role("switch", name="Tools").is_checked()
    page.reload()
    page.wait_for_selector("#composer-input", timeout=120_000)
    assert page.get_by_role("switch", name="Tools").is_checked()
    assert _axe(page) == []

    page.goto(box.url + "/")
    page.wait_for_selector("#composer-input", timeout=120_000)
    assert not page.get_by_role("switch", name="Tools").is_checked()
    off = _ask(page, "Hello otters")

    def prompt_tokens(conv: str) -> int:
        turns = http.get(f"/v1/conversations/{conv}").json()["turns"]
        answers = [t for t in turns if t["role"] == "assistant"]
        return int(answers[0]["usage"]["prompt_tokens"])

    assert prompt_tokens(on) > prompt_tokens(off) + 500  # the tools' descriptions
    page.context.close()
    assert not errors, errors
