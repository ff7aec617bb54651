"""The admin console in headless Chromium (tiny model): the live plots render and update
without a reload, a trace opens to its waterfall, under the strict CSP.

Run: pytest -m browser tests/web/test_console_browser.py
Screenshots: console-*.png in a temporary directory (scripts/screenshots.sh: docs/screenshots)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from chatbox.catalog.registry import ModelRegistry
from tests.conftest import ADMIN_NAME, LiveServer, test_settings
from tests.web.test_browser import SHOTS, browser, login, page  # noqa: F401  (shared fixtures)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.store_agnostic("the console's plots and waterfall in a browser"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[LiveServer]:
    from chatbox.chat.policy import default_policy_path

    data_dir: Path = tmp_path_factory.mktemp("console") / "data"
    # No rate limits: `load` below asks as fast as answers come, and a faster engine would
    # otherwise spend the admin's requests-per-minute before the next test asks its own.
    policy = data_dir.parent / "policy.toml"
    text = default_policy_path().read_text()
    for limit in ("rpm = 20\n", "rpm = 120\n", "tpm = 20000\n", "tpm = 200000\n"):
        text = text.replace(limit, limit.split("=")[0] + "= 0\n")
    policy.write_text(text)
    settings = test_settings(data_dir, console_sample_s=0.5, max_tokens=48, policy_path=policy)
    # The built-in catalogue too: its models (listed, not installed) are what a Models page
    # shows, with their sources and descriptions.
    registry = ModelRegistry(data_dir / "models")
    registry.add(tiny_gguf, name="tiny", make_default=True, copy=False)
    with LiveServer(settings, registry) as live:
        yield live


def load(server: LiveServer, seconds: float) -> threading.Thread:
    """Completions from four clients for `seconds` (something for the plots to show)."""

    def one() -> None:
        import time

        end = time.monotonic() + seconds
        with httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as c:
            while time.monotonic() < end:
                c.post(
                    "/v1/chat/completions",
                    json={"messages": [{"role": "user", "content": "Tell me a story"}]},
                )

    threads = [threading.Thread(target=one, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    return threads[0]


def plot_state(pg: Any, key: str) -> dict[str, Any]:
    state: dict[str, Any] = pg.evaluate(
        "(k) => { const f = document.querySelector(`figure[data-plot=${k}]`);"
        " return {...f.dataset, canvas: !!f.querySelector('canvas')}; }",
        key,
    )
    return state


def test_live_plots_render_and_update(server: LiveServer, page: Any) -> None:  # noqa: F811
    SHOTS.mkdir(parents=True, exist_ok=True)
    worker = load(server, 6.0)
    page.goto(server.url + "/console/live")
    page.wait_for_selector("figure[data-plot=tokens_per_s][data-rendered=true]")
    first = plot_state(page, "tokens_per_s")
    assert first["canvas"] and "tiny" in first["series"]
    page.wait_for_function(
        "(n) => +document.querySelector('figure[data-plot=tokens_per_s]').dataset.points > n",
        arg=int(first["points"]) + 2,
    )
    later = plot_state(page, "tokens_per_s")
    assert int(later["updates"]) > int(first["updates"])  # updated in place, no reload
    for key in ("ttft", "tpot", "running", "kv_cells_used", "requests_per_s"):
        page.wait_for_selector(f"figure[data-plot={key}][data-rendered=true]")
    assert "ttft_p99" in plot_state(page, "ttft")["series"]
    worker.join()
    page.screenshot(path=str(SHOTS / "console-live.png"), full_page=True)


def test_a_trace_opens_to_its_waterfall(server: LiveServer, page: Any) -> None:  # noqa: F811
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as c:
        conv = c.post("/v1/conversations", json={}).json()["id"]
        r = c.post(f"/v1/conversations/{conv}/turns", json={"content": "Hello"})
        trace_id = r.headers["x-trace-id"]
    page.goto(server.url + "/console/traces")
    page.click(f"a[href='/console/traces/{trace_id}']")
    page.wait_for_selector(".waterfall-row")
    names = page.eval_on_selector_all(".waterfall-name", "els => els.map(e => e.textContent)")
    assert {"turn", "admission", "engine.prefill", "engine.decode", "store.save_answer"} <= set(
        names
    )
    widths = page.eval_on_selector_all(".waterfall-bar", "els => els.map(e => e.style.width)")
    assert all(w.endswith("%") for w in widths)
    page.screenshot(path=str(SHOTS / "console-trace.png"), full_page=True)


def test_people_and_models_pages(server: LiveServer, page: Any) -> None:  # noqa: F811
    page.goto(server.url + "/console/people")
    page.fill("input[name=name]", "erin")
    page.fill("input[name=password]", "erin-password")
    page.click("form.console-form button[type=submit]")
    page.wait_for_selector("text=Added erin.")
    assert page.locator("button:has-text('Create key')").count() == 0  # erin makes her own
    page.goto(server.url + "/console/people")
    page.click(f"a:text-is('{ADMIN_NAME}')")
    page.fill("input[placeholder='e.g. laptop script']", "notebook")
    page.click("text=Create key")
    secret = page.wait_for_selector("[data-testid=secret]").inner_text()
    assert secret.startswith("sk-") or len(secret) > 20
    page.wait_for_selector("#usage-plot[data-rendered=true]")
    page.screenshot(path=str(SHOTS / "console-person.png"), full_page=True)
    page.goto(server.url + "/console/models")
    page.wait_for_selector("tr[data-model=tiny]")
    page.screenshot(path=str(SHOTS / "console-models.png"), full_page=True)
    page.goto(server.url + "/console/audit")
    assert page.locator("code", has_text="key.create").count() >= 1


def test_a_taken_name_is_said_for_a_person_and_a_workspace(
    server: LiveServer,
    page: Any,  # noqa: F811
) -> None:
    page.goto(server.url + "/console/people")
    page.fill("input[name=name]", ADMIN_NAME)
    page.fill("input[name=password]", "another-password")
    page.click("form.console-form button[type=submit]")
    alert = page.wait_for_selector("#alerts .alert")
    assert "already exists" in alert.inner_text()
    assert page.input_value("input[name=name]") == ADMIN_NAME  # what was typed stays
    page.goto(server.url + "/console/workspaces")
    page.fill("#new-workspace input[name=name]", "Support")
    page.click("#new-workspace button[type=submit]")
    page.wait_for_selector("text=Created Support")
    page.fill("#new-workspace input[name=name]", "Support")
    page.click("#new-workspace button[type=submit]")
    alert = page.wait_for_selector("#alerts .alert")
    assert "named 'Support' exists" in alert.inner_text(), alert.inner_text()


def test_models_table_fits_its_box(server: LiveServer, page: Any) -> None:  # noqa: F811
    """At 1280 px, with the catalogue's models, each model's state and buttons are in view."""
    page.goto(server.url + "/console/models")
    page.wait_for_selector("tr[data-model=smollm2]")
    fits = page.evaluate(
        """() => {
          const main = document.querySelector('#console-main');
          const table = main.querySelector('table');
          const box = table.getBoundingClientRect();
          const buttons = [...table.querySelectorAll('.console-actions .btn')].map(
            (b) => b.getBoundingClientRect());
          return {table: table.scrollWidth, room: table.clientWidth, right: box.right,
                  buttons: buttons.map((r) => r.right)};
        }"""
    )
    assert fits["table"] <= fits["room"], fits
    assert fits["buttons"] and max(fits["buttons"]) <= fits["right"], fits
