"""The console's Replicas and Alerts pages in headless Chromium against `chatbox serve` in
router mode with one (fake) replica: an admin sees each replica's state, models and load and
drains and undrains one; sees the alert its loss fires, silences it for an hour (the webhook
then hears nothing of it, the audit log has the silence) and its recent history. Both pages
are in the console's navigation and axe-clean on a desktop and on a phone.

Run: pytest -m browser tests/web/test_console_ops_browser.py
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.observability.test_alerts_served import Listener
from tests.served import Served, free_port
from tests.web.test_browser import CHROMIUM, CHROMIUM_ARGS
from tests.web.test_ui_walk_browser import AXE, DESKTOP, PHONE, Box, Tab

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

DOWN = "ChatboxReplicaDown"


def _wait(what: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.25)


class Fleet:
    """The served front, its fake replica (closed and reopened at will), the webhook's inbox."""

    def __init__(self, served: Served, port: int, posted: list[dict[str, Any]]) -> None:
        self.served = served
        self.port = port
        self.replica_url = f"http://127.0.0.1:{port}"
        self.replica: Listener | None = Listener(port)
        self.posted = posted

    def alerts(self) -> dict[str, Any]:
        r = httpx.get(self.served.url + "/console/data/alerts", headers=self.served.admin)
        return dict(r.json())

    def posts(self, status: str) -> list[dict[str, Any]]:
        return [
            a
            for p in self.posted
            for a in p["alerts"]
            if a["status"] == status and a["labels"]["alertname"] == DOWN
        ]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Fleet]:
    where = tmp_path_factory.mktemp("ops")
    posted: list[dict[str, Any]] = []
    hook = Listener(free_port(), lambda body: posted.append(json.loads(body)))
    port = free_port()
    served = Served(
        where,
        model=tiny_gguf,
        env={
            "CHATBOX_REPLICAS": f"http://127.0.0.1:{port}",
            "CHATBOX_REPLICA_TOKEN": "t" * 32,
            "CHATBOX_REPLICA_HEALTH_S": "0.3",
            "CHATBOX_CONSOLE_SAMPLE_S": "0.5",
            "CHATBOX_ALERT_WEBHOOK_URL": f"http://127.0.0.1:{hook.server.server_address[1]}/h",
        },
    )
    f = Fleet(served, port, posted)
    try:
        with served:
            yield f
    finally:
        if f.replica is not None:
            f.replica.close()
        hook.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    assert AXE.exists(), f"{AXE} is missing: run `npm install`"
    executable = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    if executable is None:
        pytest.skip("no chromium to drive")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield b
        b.close()


def _clean(tab: Tab) -> None:
    found = {"axe": tab.axe(), "overflow": tab.overflow(), "console": list(tab.errors)}
    assert not any(found.values()), json.dumps(found, indent=1)


def _audit(fleet: Fleet, action: str) -> list[dict[str, Any]]:
    return list(json.loads(fleet.served.cli("audit", "list", "--action", action, "--json")))


def test_alerts_page_shows_firing_and_history_and_silences(fleet: Fleet, browser: Any) -> None:
    assert fleet.replica is not None
    fleet.replica.close()
    fleet.replica = None
    _wait(lambda: any(a["labels"]["alertname"] == DOWN for a in fleet.alerts()["firing"]))
    _wait(lambda: bool(fleet.posts("firing")))

    tab = Tab(browser, Box(fleet.served), DESKTOP, "admin")
    pg = tab.page
    try:
        tab.go("/console/live")
        pg.click("nav.console-nav >> text=Alerts")
        pg.wait_for_selector("h1:has-text('Alerts')")
        row = pg.locator(f"#alerts-firing tr[data-alert={DOWN}]")
        assert fleet.replica_url in row.inner_text()
        _clean(tab)

        row.locator("select[name=minutes]").select_option("60")
        row.locator("button", has_text="Silence").click()
        pg.wait_for_selector(f"#alerts-firing tr[data-alert={DOWN}] .silenced")
        assert "Silenced until" in pg.locator(f"#alerts-firing tr[data-alert={DOWN}]").inner_text()
        assert DOWN in pg.locator("#alert-silences").inner_text()
        [entry] = _audit(fleet, "alert.silence")
        assert entry["detail"]["alertname"] == DOWN and entry["detail"]["minutes"] == 60

        # Back up: it resolves in the console's history, and nothing is posted while silenced.
        fleet.replica = Listener(fleet.port)
        _wait(lambda: not fleet.alerts()["firing"])
        tab.go("/console/alerts")
        history = pg.locator(f"#alerts-recent li[data-alert={DOWN}][data-status=resolved]")
        assert history.count() >= 1
        assert fleet.posts("resolved") == []
        _clean(tab)
    finally:
        tab.close()

    phone = Tab(browser, Box(fleet.served), PHONE, "admin", dark=True)
    try:
        phone.go("/console/alerts")
        assert phone.page.locator("#alert-silences").is_visible()
        _clean(phone)
    finally:
        phone.close()


def test_replicas_page_shows_load_and_drains(fleet: Fleet, browser: Any) -> None:
    _wait(
        lambda: all(
            r["state"] == "healthy"
            for r in httpx.get(
                fleet.served.url + "/v1/admin/replicas", headers=fleet.served.admin
            ).json()["replicas"]
        )
    )
    tab = Tab(browser, Box(fleet.served), DESKTOP, "admin")
    pg = tab.page
    try:
        tab.go("/console/live")
        pg.click("nav.console-nav >> text=Replicas")
        pg.wait_for_selector("h1:has-text('Replicas')")
        row = pg.locator(f"#replicas tr[data-replica='{fleet.replica_url}']")
        assert row.locator("[data-state]").inner_text() == "healthy"
        assert "tiny" in row.inner_text()  # the model it serves
        assert pg.locator("#replicas tr[data-replica=local]").count() == 1
        _clean(tab)

        row.locator("button", has_text="Drain").click()
        pg.wait_for_selector(
            f"#replicas tr[data-replica='{fleet.replica_url}'] [data-state=draining]"
        )
        assert "drains" in pg.locator(".console-notice").inner_text()
        api = httpx.get(fleet.served.url + "/v1/admin/replicas", headers=fleet.served.admin)
        states = {r["url"]: r["state"] for r in api.json()["replicas"]}
        assert states[fleet.replica_url] == "draining"
        assert _audit(fleet, "replica.drain")[0]["detail"]["url"] == fleet.replica_url

        row = pg.locator(f"#replicas tr[data-replica='{fleet.replica_url}']")
        row.locator("button", has_text="Undrain").click()
        pg.wait_for_selector(
            f"#replicas tr[data-replica='{fleet.replica_url}'] [data-state=healthy]"
        )
        assert _audit(fleet, "replica.undrain")
        _clean(tab)
    finally:
        tab.close()

    phone = Tab(browser, Box(fleet.served), PHONE, "admin", dark=True)
    try:
        phone.go("/console/replicas")
        _clean(phone)
    finally:
        phone.close()
