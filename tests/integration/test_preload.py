"""Models are ready before users arrive: `chatbox serve` loads every tier's default model
at start, `/readyz` names each one's state, and a send that waits shows why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.served import Served

POLICY = """
[tiers.free]
model = "tiny"

[tiers.paid]
model = "tiny-paid"

[tiers.team]
model = "not-installed"

[moderation]
output = false
"""


def test_every_tier_default_is_loaded_before_ready(tmp_path: Path, tiny_gguf: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    box = Served(tmp_path, model=tiny_gguf, policy=policy)
    box.cli("models", "add", str(tiny_gguf), "--name", "tiny-paid", "--link")
    with box:
        ready = httpx.get(box.url + "/readyz", timeout=10).json()  # the first "ready"
        assert ready["status"] == "ready"
        assert ready["models"] == {"tiny": "loaded", "tiny-paid": "loaded"}
        paid = box.user("pat", tier="paid")
        answer = httpx.post(
            box.url + "/v1/chat/completions",
            headers=box.auth(paid),
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            timeout=60,
        )
        assert answer.status_code == 200 and answer.json()["model"] == "tiny-paid"
    assert "tier team names model not-installed, which is not installed" in box.log()


@pytest.mark.browser
def test_a_waiting_send_shows_the_bubble_and_the_model_loading(
    tmp_path: Path, tiny_gguf: Path
) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    chromium = "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
    chromium = chromium or shutil.which("chromium")
    if chromium is None:
        pytest.skip("no chromium to drive")
    with Served(tmp_path, model=tiny_gguf) as box, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(box.url + "/login")
        page.fill("input[name=name]", "admin")
        page.fill("input[name=password]", "served-admin-password")
        page.click("button[type=submit]")
        page.wait_for_selector("#composer-input")
        # The endpoint the note reads, as the logged-in page sees it.
        real = page.request.get(box.url + "/ui/loading")
        assert real.ok and real.json() == {"loading": {}}
        held: list[Any] = []
        page.route("**/ui/new/send", lambda route: held.append(route))  # the model "loads"
        page.route(
            "**/ui/loading",
            lambda route: route.fulfill(
                content_type="application/json", body=json.dumps({"loading": {"tiny": 2}})
            ),
        )
        page.fill("#composer-input", "Hello while it loads")
        page.keyboard.press("Enter")
        mine = page.locator(".turn.pending.user")
        mine.wait_for(timeout=2000)
        assert mine.inner_text().strip() == "Hello while it loads"
        note = page.locator(".turn.pending.assistant .wait-note")
        page.wait_for_function(
            "() => document.querySelector('.wait-note')?.textContent.includes('Loading')",
            timeout=5000,
        )
        assert "Loading the model tiny" in note.inner_text()
        assert "2 messages are waiting" in note.inner_text()
        page.unroute("**/ui/loading")
        for route in held:
            route.continue_()
        page.wait_for_selector(".turn.user:not(.pending) .plain", timeout=30000)
        assert page.locator(".turn.pending").count() == 0
        browser.close()
