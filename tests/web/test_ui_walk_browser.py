"""Every page of the UI in headless Chromium, on a desktop (1280x800) and a phone (390x844),
against `chatbox serve` (tiny model): axe-core (WCAG 2.1 A and AA) finds nothing, nothing
overflows the viewport sideways, the browser console stays free of errors; then the flows
whose layout or focus broke on a phone, for an admin, or after an action.

axe-core comes from node_modules (`npm install`, a devDependency): the test injects it; the
server never serves it. Screenshots go to a temporary directory (scripts/screenshots.sh
refreshes the docs' own on purpose).

Run: pytest -m browser tests/web/test_ui_walk_browser.py
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.served import ADMIN_PASSWORD, Served
from tests.web.test_browser import CHROMIUM, CHROMIUM_ARGS

pytestmark = [
    pytest.mark.browser,
    pytest.mark.store_agnostic("every page's layout, accessibility and console in a browser"),
]

ROOT = Path(__file__).resolve().parents[2]
AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
LONG_FACT = "I keep a detailed record of every single houseplant I own, with watering days"


@dataclass
class Box:
    """The served box and what the walk needs of it: ids made through the API."""

    served: Served
    conv: str = ""
    share: str = ""
    workspace: str = ""
    trace: str = ""
    member: str = ""
    ids: dict[str, str] = field(default_factory=dict)


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Box]:
    where = tmp_path_factory.mktemp("walk")
    with Served(where, model=tiny_gguf) as served:
        b = Box(served)
        b.member = served.user("rosa")
        with httpx.Client(base_url=served.url, headers=served.admin, timeout=120) as c:
            b.conv = c.post("/v1/conversations", json={"title": "Otters"}).json()["id"]
            r = c.post(f"/v1/conversations/{b.conv}/turns", json={"content": "Hello otters"})
            assert r.status_code == 200, r.text
            b.trace = r.headers["x-trace-id"]
            share = c.post(f"/v1/conversations/{b.conv}/shares", json={}).json()
            b.share = share["url"].rsplit("/", 1)[-1]
            ws = c.post("/v1/workspaces", json={"name": "Support"}).json()
            b.workspace = ws["id"]
        yield b


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    if not AXE.exists():
        pytest.fail(f"{AXE} is missing: run `npm install` (axe-core is a devDependency)")
    executable = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    if executable is None:
        pytest.skip("no chromium to drive")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots() -> Iterator[Path]:
    """Every state's screenshot, in a temporary directory (CHATBOX_WALK_SHOTS: kept there)."""
    kept = os.environ.get("CHATBOX_WALK_SHOTS")
    where = Path(kept) if kept else Path(tempfile.mkdtemp(prefix="chatbox-walk-"))
    where.mkdir(parents=True, exist_ok=True)
    yield where
    if not kept:
        shutil.rmtree(where, ignore_errors=True)


class Tab:
    """One browser context at one size, logged in or not, that records console errors."""

    def __init__(
        self, browser: Any, box: Box, viewport: dict[str, int], who: str | None, dark: bool = False
    ) -> None:
        self.box = box
        self.context = browser.new_context(
            viewport=viewport,
            locale="en-GB",
            timezone_id="Europe/Paris",
            color_scheme="dark" if dark else "light",
        )
        self.page = self.context.new_page()
        self.page.set_default_timeout(30_000)
        self.errors: list[str] = []
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.on("console", self._console)
        if who is not None:
            self.login(who, ADMIN_PASSWORD if who == "admin" else who * 2)

    def _console(self, m: Any) -> None:
        # An error page's own status is no script's error: a 404 page answers 404.
        if m.type not in ("error", "warning") or m.location.get("url") == self.page.url:
            return
        self.errors.append(f"{m.text} ({m.location.get('url')})")

    def login(self, name: str, password: str) -> None:
        self.page.goto(self.box.served.url + "/login")
        self.page.fill("input[name=name]", name)
        self.page.fill("input[name=password]", password)
        self.page.click("button[type=submit]")
        self.page.wait_for_selector("#composer-input")

    def go(self, path: str) -> Any:
        response = self.page.goto(self.box.served.url + path)
        self.page.wait_for_load_state("networkidle")
        return response

    def axe(self) -> list[str]:
        """axe-core's WCAG 2.1 A/AA violations on the page as it is now."""
        if not self.page.evaluate("() => !!window.axe"):
            self.page.evaluate(AXE.read_text() + "\n;0")
        found = self.page.evaluate(
            """async () => {
                const r = await axe.run(document, {runOnly: {type: 'tag',
                    values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa']}});
                return r.violations.map(v => v.id + ': ' + v.nodes.map(
                    n => n.target.join(' ') + ' ' + (n.any[0] ? n.any[0].message : '')
                ).slice(0, 4).join(' | '));
            }"""
        )
        return list(found)

    def overflow(self) -> list[str]:
        """Visible elements that reach past the viewport's right or left edge."""
        found = self.page.evaluate(
            """() => {
                const w = document.documentElement.clientWidth, out = [];
                if (document.documentElement.scrollWidth > w) out.push('page scrolls sideways '
                    + document.documentElement.scrollWidth + ' > ' + w);
                for (const el of document.querySelectorAll('body *')) {
                    const r = el.getBoundingClientRect();
                    if (!r.width || !r.height) continue;
                    if (el.closest('.visually-hidden, .skip-link')) continue;
                    // hidden, or inside a closed <details>: nothing to see or reach
                    if (!el.checkVisibility({visibilityProperty: true})) continue;
                    // inside a box that scrolls or clips sideways: the box is what counts
                    let p = el.parentElement, clipped = false;
                    while (p && p !== document.body) {
                        const ps = getComputedStyle(p);
                        if (['auto', 'scroll', 'hidden', 'clip'].includes(ps.overflowX)) {
                            const pr = p.getBoundingClientRect();
                            if (r.right > pr.right + 1 || r.left < pr.left - 1) { clipped = true; }
                            break;
                        }
                        p = p.parentElement;
                    }
                    if (clipped) continue;
                    if (r.right > w + 1 || r.left < -1) {
                        out.push((el.id ? '#' + el.id : el.tagName.toLowerCase()
                            + (el.className && typeof el.className === 'string'
                               ? '.' + el.className.trim().split(/\\s+/).join('.') : ''))
                            + ` [${Math.round(r.left)}, ${Math.round(r.right)}]`);
                    }
                }
                return out.slice(0, 6);
            }"""
        )
        return list(found)

    def close(self) -> None:
        self.context.close()


# (name, who, path, an action that opens the state after the page loaded)
STATES: list[tuple[str, str | None, str, str]] = [
    ("login", None, "/login", ""),
    ("new-chat", "admin", "/", ""),
    ("chat", "admin", "/c/{conv}", ""),
    ("chat-share", "admin", "/c/{conv}", "share"),
    ("chat-settings", "admin", "/c/{conv}", "settings"),
    ("chat-streaming", "admin", "/", "stream"),
    ("memory", "admin", "/memory", "fact"),
    ("library", "admin", "/library", ""),
    ("data", "admin", "/settings/data", ""),
    ("temporary", "admin", "/temporary", ""),
    ("workspace", "admin", "/w/{workspace}", ""),
    ("share-page", None, "/s/{share}", ""),
    ("console-live", "admin", "/console/live", ""),
    ("console-traces", "admin", "/console/traces", ""),
    ("console-trace", "admin", "/console/traces/{trace}", ""),
    ("console-people", "admin", "/console/people", ""),
    ("console-person", "admin", "/console/people", "person"),
    ("console-models", "admin", "/console/models", ""),
    ("console-replicas", "admin", "/console/replicas", ""),
    ("console-alerts", "admin", "/console/alerts", ""),
    ("console-workspaces", "admin", "/console/workspaces", ""),
    ("console-evals", "admin", "/console/evals", ""),
    ("console-canaries", "admin", "/console/canaries", ""),
    ("console-audit", "admin", "/console/audit", ""),
    ("usage", "admin", "/admin/usage", ""),
    ("moderation", "admin", "/admin/moderation", ""),
    ("not-found", "admin", "/c/nope", ""),
    ("forbidden", "rosa", "/console/live", ""),
]


def open_state(tab: Tab, path: str, action: str) -> None:
    b = tab.box
    tab.page.unroute_all(behavior="ignoreErrors")  # a stream held by the streaming state
    tab.go(path.format(conv=b.conv, share=b.share, workspace=b.workspace, trace=b.trace))
    pg = tab.page
    if action == "share":
        pg.click("summary[aria-label=Share]")
        pg.wait_for_selector("#share-panel .share-link, #share-panel button")
    elif action == "settings":
        pg.click("summary[aria-label='Chat settings']")
    elif action == "fact":
        if not pg.locator(".fact").count():
            pg.fill("#new-fact", LONG_FACT)
            pg.click(".memory-add button[type=submit]")
            pg.wait_for_selector(".fact")
    elif action == "person":
        pg.click("table a[href^='/console/people/']")
        pg.wait_for_selector("h1")
    elif action == "stream":
        # The answer's events are held back, so the page stays in its streaming state (the
        # tiny model would finish before axe looks); the page is never network-idle then.
        pg.route("**/stream", lambda route: None)
        pg.fill("#composer-input", "Tell me about otters")
        pg.keyboard.press("Enter")
        pg.wait_for_selector("#turns .turn.assistant.streaming .typing")
        return
    pg.wait_for_load_state("networkidle")


# The phone walks in dark mode, the desktop in light: both palettes, one walk each.
@pytest.mark.parametrize("size", ["desktop", "phone"])
def test_every_page_is_accessible_fits_and_logs_no_error(
    box: Box, browser: Any, shots: Path, size: str
) -> None:
    viewport = DESKTOP if size == "desktop" else PHONE
    tabs: dict[str | None, Tab] = {}
    problems: dict[str, Any] = {}
    try:
        for name, who, path, action in STATES:
            if who not in tabs:
                tabs[who] = Tab(browser, box, viewport, who, dark=size == "phone")
            tab = tabs[who]
            open_state(tab, path, action)
            found = {
                "axe": tab.axe(),
                "overflow": tab.overflow(),
                "console": list(tab.errors),
            }
            tab.errors.clear()
            tab.page.screenshot(path=str(shots / f"{name}-{size}.png"), full_page=True)
            if any(found.values()):
                problems[name] = {k: v for k, v in found.items() if v}
    finally:
        for tab in tabs.values():
            tab.close()
    assert not problems, json.dumps(problems, indent=1)


def test_phone_layouts_fit(box: Box, browser: Any) -> None:
    """On a phone: the share panel on screen, a memory row no wider than the screen with its
    Delete in reach, the console's nav collapsed above a full-width page with its tables
    scrolling in their box, and the context gauge's text whole."""
    tab = Tab(browser, box, PHONE, "admin")
    pg = tab.page
    try:
        open_state(tab, "/c/{conv}", "share")
        panel = pg.locator("#share .settings-panel").bounding_box()
        assert panel["x"] >= 0 and panel["x"] + panel["width"] <= PHONE["width"], panel
        gauge = pg.evaluate(
            "() => { const t = document.querySelector('#context-meter .meter-text');"
            " return [t.scrollWidth, t.clientWidth, t.getBoundingClientRect().right]; }"
        )
        assert gauge[0] <= gauge[1] and gauge[2] <= PHONE["width"], gauge

        open_state(tab, "/memory", "fact")
        row = pg.locator(".fact").first.bounding_box()
        assert row["x"] + row["width"] <= PHONE["width"], row
        delete = pg.locator(".fact button.btn-danger").first
        box_ = delete.bounding_box()
        assert box_["x"] >= 0 and box_["x"] + box_["width"] <= PHONE["width"], box_
        delete.click(trial=True)  # nothing covers it

        open_state(tab, "/console/audit", "")
        nav = pg.locator(".console-nav").bounding_box()
        main = pg.locator("#console-main").bounding_box()
        # the nav's links wrap to a few rows (a quarter of the phone's height at most)
        assert nav["width"] > 0.9 * PHONE["width"] and nav["height"] < PHONE["height"] / 4, nav
        assert main["width"] > 0.9 * PHONE["width"], main
        table = pg.evaluate(
            "() => { const t = document.querySelector('#console-main table');"
            " const r = t.getBoundingClientRect();"
            " return [r.right, t.scrollWidth > t.clientWidth, getComputedStyle(t).overflowX]; }"
        )
        assert table[0] <= PHONE["width"] and table[2] == "auto", table
        assert not tab.errors, tab.errors
    finally:
        tab.close()


def test_keyboard_focus_and_the_skip_link(box: Box, browser: Any) -> None:
    """Esc closing chat settings gives focus back to the button that opened them; "Skip to
    message box" is only on pages with a message box."""
    tab = Tab(browser, box, DESKTOP, "admin")
    pg = tab.page
    try:
        open_state(tab, "/c/{conv}", "")
        assert pg.locator("a.skip-link[href='#composer-input']").count() == 1
        pg.focus("summary[aria-label='Chat settings']")
        pg.keyboard.press("Enter")
        pg.wait_for_selector("#settings[open]")
        pg.focus("#settings input[name=title]")
        pg.keyboard.press("Escape")
        assert pg.locator("#settings[open]").count() == 0
        label = pg.evaluate("() => document.activeElement.getAttribute('aria-label')")
        assert label == "Chat settings"
        for path in ("/memory", "/library", "/settings/data", "/console/people"):
            tab.go(path)
            assert pg.locator("a.skip-link").count() == 0, path
        assert not tab.errors, tab.errors
    finally:
        tab.close()


def test_admins_reach_the_console_and_read_times(box: Box, browser: Any) -> None:
    """The chat links the console for an admin (not for a member); Usage and Moderation sit
    in the console's frame; adding a person puts the person's address in the bar; the
    moderation queue's times read in the viewer's locale and zone, not as epoch numbers."""
    tab = Tab(browser, box, DESKTOP, "admin")
    pg = tab.page
    member = Tab(browser, box, DESKTOP, "rosa")
    try:
        tab.go("/")
        pg.click("[data-testid=console-link]")
        pg.wait_for_selector(".console-nav")
        assert member.page.locator("[data-testid=console-link]").count() == 0
        for path, label in (("/admin/usage", "Usage"), ("/admin/moderation", "Moderation")):
            tab.go(path)
            current = pg.locator(".console-nav a[aria-current=page]")
            assert current.inner_text().strip() == label, path

        tab.go("/console/people")
        pg.fill("input[name=name]", "erin")
        pg.fill("input[name=password]", "erin-password")
        pg.click("form.console-form button[type=submit]")
        pg.wait_for_selector("text=Added erin.")
        assert (
            "/console/people/" in pg.url
            and pg.url.rstrip("/") != box.served.url + "/console/people"
        )
        pg.reload()
        assert pg.locator("h1").inner_text().strip() == "erin"

        # A refused message puts an item in the queue; its time reads as a date here.
        with httpx.Client(base_url=box.served.url, timeout=60) as c:
            c.post(
                "/v1/chat/completions",
                headers=box.served.auth(box.member),
                json={"messages": [{"role": "user", "content": "I want to kill myself tonight"}]},
            )
        tab.go("/admin/moderation?status=all")
        when = pg.locator(".moderation-table tbody time").first
        text = when.inner_text()
        assert when.get_attribute("datetime").endswith("Z")
        assert not text.strip().isdigit() and "UTC" not in text, text
        expected = pg.evaluate(
            "(iso) => new Intl.DateTimeFormat('en-GB', {dateStyle: 'medium',"
            " timeStyle: 'short', timeZone: 'Europe/Paris'}).format(new Date(iso))",
            when.get_attribute("datetime"),
        )
        assert text == expected
        assert not tab.errors and not member.errors, (tab.errors, member.errors)
    finally:
        tab.close()
        member.close()


def test_moderation_and_refusals_speak_plainly(box: Box, browser: Any) -> None:
    """A self-harm message gets a calm support card with helpline links, not a red alert;
    a disabled account that gives its right password is told it is disabled (a wrong
    password still hears only "Wrong name or password."); the 403 page says what was refused."""
    tab = Tab(browser, box, DESKTOP, "rosa")
    pg = tab.page
    try:
        tab.go("/")
        pg.fill("#composer-input", "I want to kill myself tonight")
        pg.keyboard.press("Enter")
        # the first check may wait for the classifier, trained at first use
        card = pg.wait_for_selector("[data-testid=support-card]", timeout=120_000)
        assert pg.locator("#alerts .alert, #alerts [role=alert]").count() == 0
        links = pg.eval_on_selector_all(
            "[data-testid=support-card] a", "els => els.map(a => a.getAttribute('href'))"
        )
        assert "tel:988" in links and "https://findahelpline.com" in links, links
        assert "988" in card.inner_text()

        response = tab.go("/console/live")
        assert response.status == 403
        assert pg.locator("h1").inner_text() == "Not allowed"
        assert "admins" in pg.locator("main p").first.inner_text()
        tab.errors.clear()  # the 403 itself

        box.served.cli("users", "disable", "rosa")
        try:
            anon = Tab(browser, box, DESKTOP, None)
            for password, said in (
                ("wrong-password", "Wrong name or password."),
                ("rosa" * 2, "This account is disabled."),
            ):
                anon.go("/login")
                anon.page.fill("input[name=name]", "rosa")
                anon.page.fill("input[name=password]", password)
                anon.page.click("button[type=submit]")
                alert = anon.page.wait_for_selector(".alert-error").inner_text()
                assert alert.startswith(said), alert
            anon.close()
        finally:
            box.served.cli("users", "enable", "rosa")
    finally:
        tab.close()


def test_views_stay_current(box: Box, browser: Any, tmp_path: Path) -> None:
    """The tab title follows a rename; an import lists the new chats in the sidebar at once;
    Stop logs no error in the browser console."""
    tab = Tab(browser, box, DESKTOP, "admin")
    pg = tab.page
    try:
        open_state(tab, "/c/{conv}", "settings")
        pg.fill("#settings input[name=title]", "Sea otters, renamed")
        pg.click("#settings button[type=submit]")
        pg.wait_for_function("() => document.title.startsWith('Sea otters, renamed')")

        export = tmp_path / "conversations.json"
        export.write_text(
            json.dumps(
                [
                    {
                        "title": "Imported kelp chat",
                        "create_time": 1700000000.0,
                        "mapping": {
                            "a": {"id": "a", "parent": None, "children": ["b"], "message": None},
                            "b": {
                                "id": "b",
                                "parent": "a",
                                "children": [],
                                "message": {
                                    "author": {"role": "user"},
                                    "create_time": 1700000000.0,
                                    "content": {"content_type": "text", "parts": ["What is kelp?"]},
                                },
                            },
                        },
                        "current_node": "b",
                    }
                ]
            )
        )
        tab.go("/settings/data")
        pg.set_input_files("#import-file", str(export))
        pg.click("#import-form button[type=submit]")
        pg.wait_for_selector("#import-result")
        pg.wait_for_selector("#conv-list .conv-item:has-text('Imported kelp chat')")

        tab.go(f"/c/{box.conv}")
        pg.fill("#composer-input", "Tell me a very long story about otters and kelp forests")
        pg.keyboard.press("Enter")
        pg.wait_for_selector("#turns > .turn.assistant >> nth=1")
        # The tiny model may finish first: Stop is clicked as the page would, shown or not.
        pg.evaluate("() => document.querySelector('.composer .stop').click()")
        pg.wait_for_selector("#turns > .turn.assistant[data-status]:not(.streaming) >> nth=1")
        pg.wait_for_load_state("networkidle")
        assert not tab.errors, tab.errors
    finally:
        tab.close()
