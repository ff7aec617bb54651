"""The admin console: admins only, and every action takes effect and lands in the audit log."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.gateway import Box, gateway_box

PAGES = [
    "/console",
    "/console/live",
    "/console/data/live",
    "/console/traces",
    "/console/data/traces",
    "/console/data/alerts",
    "/console/people",
    "/console/models",
    "/console/audit",
]


@pytest.fixture
def box(tmp_path: Path, tiny_gguf: Path) -> Box:
    with gateway_box(tmp_path, tiny_gguf) as b:
        yield b  # type: ignore[misc]


def _uid(box: Box, name: str) -> str:
    page = box.client.get("/console/people").text
    match = re.search(r'href="/console/people/([^"]+)">' + re.escape(name) + "<", page)
    assert match, page
    return match.group(1)


def audit_actions(box: Box) -> list[str]:
    page = box.client.get("/console/audit").text
    return re.findall(r"<code>([a-z_.]+)</code>", page)


def post(box: Box, url: str, csrf: str, **form: str) -> object:
    return box.client.post(url, data=form, headers={"x-csrf-token": csrf, "HX-Request": "true"})


def test_anonymous_goes_to_login_and_a_member_is_refused(box: Box) -> None:
    person = f"/console/people/{'u_x'}"
    for url in [*PAGES, person, "/console/data/usage/u_x"]:
        r = box.client.get(url, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/login"), url
    for url, form in (("/console/people", {"name": "x"}), ("/console/models/tiny/unload", {})):
        r = box.client.post(url, data=form, follow_redirects=False)
        assert r.status_code in (303, 401), url
    csrf = box.login("ann")  # a member
    for url in [*PAGES, person]:
        assert box.client.get(url, follow_redirects=False).status_code == 403, url
    r = post(box, "/console/people", csrf, name="mallory", password="long-enough-1")
    assert r.status_code == 403  # type: ignore[attr-defined]
    r = post(box, "/console/models/tiny/unload", csrf)
    assert r.status_code == 403  # type: ignore[attr-defined]
    assert "tiny" in box.client.app.state.services.models.pool.loaded()


def console_routes(box: Box) -> list[tuple[str, str]]:
    """(method, path) of every console route the app has, path parameters filled in."""
    out = []
    for route in box.client.app.routes:
        if not route.path.startswith("/console"):
            continue
        path = re.sub(r"\{[^}]+\}", "x", route.path)
        out += [(m, path) for m in sorted(route.methods) if m in ("GET", "POST")]
    return out


def test_every_console_route_is_for_admins_only(box: Box) -> None:
    routes = console_routes(box)
    posts = [path for method, path in routes if method == "POST"]
    assert len(routes) >= len(PAGES) + 5 and posts, routes
    for method, path in routes:
        r = box.client.request(method, path, follow_redirects=False)
        if method == "GET":  # a browser is sent to log in
            assert r.status_code == 303 and r.headers["location"].startswith("/login"), path
        else:
            assert r.status_code in (303, 401), (path, r.status_code)
    box.login("admin")
    before = audit_actions(box)
    box.client.cookies.clear()
    csrf = box.login("ann")  # a member
    for method, path in routes:
        if method == "GET":
            r = box.client.get(path, follow_redirects=False)
        else:
            r = box.client.post(
                path,
                data={"value": "admin", "name": "x"},
                headers={"x-csrf-token": csrf, "HX-Request": "true"},
            )
        assert r.status_code == 403, (method, path, r.status_code)
    box.login("admin")
    assert audit_actions(box) == before  # none of those attempts did anything


def test_console_navigation_reaches_the_moderation_queue_and_the_audit_log(box: Box) -> None:
    box.login("admin")
    page = box.client.get("/console/live").text
    nav = page.split('class="console-nav"', 1)[1].split("</nav>", 1)[0]
    for href in ("/console/audit", "/admin/moderation", "/console/traces", "/console/people"):
        assert f'href="{href}"' in nav, href
    assert box.client.get("/admin/moderation").status_code == 200
    box.login("ann")
    assert box.client.get("/admin/moderation", follow_redirects=False).status_code == 403


def test_admin_sees_every_page(box: Box) -> None:
    box.login("admin")
    for url in PAGES:
        r = box.client.get(url)
        assert r.status_code == 200, (url, r.text[:300])
    models = box.client.get("/console/models").text
    assert "tiny" in models and "llama" in models  # the GGUF's architecture
    assert "loaded" in models
    live = box.client.get("/console/data/live").json()
    assert set(live) == {"interval_s", "t", "series"}
    page = box.client.get("/console/live").text
    assert 'data-plot="tokens_per_s"' in page
    assert 'data-plot="replica_load"' not in page  # no replicas: no per-replica plots


def test_a_firing_alert_shows_on_the_live_page_until_it_resolves(box: Box) -> None:
    box.login("admin")
    telemetry = box.client.app.state.services.telemetry
    disk = [0.5]
    telemetry.alerts.disk = lambda: disk[0]  # the test's disk, not this machine's
    at = time.time()
    asyncio.run(telemetry.sample_once(at))
    assert 'id="alerts-none"' in box.client.get("/console/live").text
    disk[0] = 0.97
    asyncio.run(telemetry.sample_once(at + 5))  # two breaching samples in a row fire it
    asyncio.run(telemetry.sample_once(at + 10))
    page = box.client.get("/console/live").text
    firing = page.split('id="alerts-firing"')[1].split("</table>")[0]
    assert 'data-alert="ChatboxDiskFilling"' in firing and "97% full" in firing
    data = box.client.get("/console/data/alerts").json()
    assert [a["labels"]["alertname"] for a in data["firing"]] == ["ChatboxDiskFilling"]
    disk[0] = 0.5
    for i in range(3):  # three clear samples in a row resolve it
        asyncio.run(telemetry.sample_once(at + 15 + 5 * i))
    page = box.client.get("/console/live").text
    assert 'id="alerts-none"' in page
    assert 'data-alert="ChatboxDiskFilling" data-status="resolved"' in page


def test_models_page_shows_where_memory_goes(box: Box) -> None:
    box.login("admin")
    page = box.client.get("/console/models").text
    memory = page.split('id="console-memory"')[1].split("</table>")[0]
    assert "Python heap" in memory and "libraries" in memory  # chatbox doctor's rows
    assert "MiB resident" in page


def test_people_actions_take_effect_and_are_audited(box: Box) -> None:
    csrf = box.login("admin")
    # without the CSRF token nothing happens
    r = box.client.post("/console/people", data={"name": "dave", "password": "dave-password"})
    assert r.status_code == 403
    r = post(box, "/console/people", csrf, name="dave", role="member", tier="free", password="pw")
    assert r.status_code == 400 and "at least 8" in r.text  # type: ignore[attr-defined]
    r = post(
        box, "/console/people", csrf, name="dave", role="member", tier="free", password="dave-pw-1"
    )
    assert r.status_code == 200 and "Added dave" in r.text  # type: ignore[attr-defined]
    dave = _uid(box, "dave")
    assert post(box, f"/console/people/{dave}/tier", csrf, value="paid").status_code == 200  # type: ignore[attr-defined]
    assert post(box, f"/console/people/{dave}/role", csrf, value="admin").status_code == 200  # type: ignore[attr-defined]
    page = box.client.get(f"/console/people/{dave}").text
    assert "admin · paid tier · active" in page

    # an admin's own key is shown once, works, and stops working when revoked
    me = _uid(box, "admin")
    r = post(box, f"/console/people/{me}/keys", csrf, value="script")
    secret = re.search(r'data-testid="secret">([^<]+)<', r.text)  # type: ignore[attr-defined]
    assert secret
    key = secret.group(1)
    headers = {"Authorization": f"Bearer {key}"}
    assert box.client.get("/v1/conversations", headers=headers).status_code == 200
    assert key not in box.client.get(f"/console/people/{me}").text
    row = re.search(r"<tr><td><code>[^<]*</code></td><td>script</td>.*?</tr>", r.text, re.S)  # type: ignore[attr-defined]
    assert row
    key_id = re.search(rf'/console/people/{me}/revoke-key/([^/"]+)"', row.group(0))
    assert key_id
    r = post(box, f"/console/people/{me}/revoke-key/{key_id.group(1)}", csrf)
    assert r.status_code == 200  # type: ignore[attr-defined]
    assert box.client.get("/v1/conversations", headers=headers).status_code == 401

    # a generated password is shown once and logs in
    r = post(box, f"/console/people/{dave}/password", csrf, value="")
    password = re.search(r'data-testid="secret">([^<]+)<', r.text)  # type: ignore[attr-defined]
    assert password
    box.passwords["dave"] = password.group(1)

    # disabling stops the account's keys at once
    ann = _uid(box, "ann")
    assert post(box, f"/console/people/{ann}/disable", csrf).status_code == 200  # type: ignore[attr-defined]
    assert box.client.get("/v1/conversations", headers=box.h("ann")).status_code == 401
    # an admin cannot lock themself out
    r = post(box, f"/console/people/{me}/disable", csrf)
    assert r.status_code == 400  # type: ignore[attr-defined]

    actions = audit_actions(box)
    for action in (
        "user.add",
        "user.set_tier",
        "user.set_role",
        "key.create",
        "key.revoke",
        "user.reset_password",
        "user.disable",
    ):
        assert action in actions, (action, actions)
    audit = box.client.get("/console/audit").text
    assert key not in audit and box.passwords["dave"] not in audit  # no secrets in the log
    box.client.cookies.clear()
    r = login_form(box, "dave")  # the generated password works (and dave is an admin now)
    assert r.status_code == 200 and "An admin reset your password on" in r.text
    assert box.client.get("/console/live").status_code == 200


def login_form(box: Box, name: str) -> Any:
    """Post the login form as a browser does, without following where it leads."""
    token = re.search(r'name="csrf_token" value="([^"]+)"', box.client.get("/login").text)
    assert token
    form = {"name": name, "password": box.passwords[name], "csrf_token": token.group(1)}
    return box.client.post("/login", data={**form, "next": "/"}, follow_redirects=False)


def test_an_admin_cannot_create_a_key_for_someone_else_but_can_revoke_theirs(box: Box) -> None:
    csrf = box.login("admin")
    ann = _uid(box, "ann")
    page = box.client.get(f"/console/people/{ann}").text
    assert "Create key" not in page and "chatbox keys create --user ann" in page
    r = post(box, f"/console/people/{ann}/keys", csrf, value="read her chats")
    assert r.status_code == 403  # type: ignore[attr-defined]
    assert "cannot create an API key for ann" in r.text  # type: ignore[attr-defined]
    assert 'data-testid="secret"' not in r.text  # type: ignore[attr-defined]
    # nor with the admin's key instead of the console's session
    box.client.cookies.clear()
    r = box.client.post(f"/console/people/{ann}/keys", data={"value": "x"}, headers=box.h("admin"))
    assert r.status_code == 403 and "cbx-" not in r.text
    csrf = box.login("admin")
    assert "key.create" not in audit_actions(box)
    page = box.client.get(f"/console/people/{ann}").text
    key_id = re.findall(rf'/console/people/{ann}/revoke-key/([^/"]+)"', page)
    assert len(key_id) == 1  # only the key ann already had

    # revoking is still an admin's: it takes nothing from ann but access
    assert box.client.get("/v1/conversations", headers=box.h("ann")).status_code == 200
    r = post(box, f"/console/people/{ann}/revoke-key/{key_id[0]}", csrf)
    assert r.status_code == 200  # type: ignore[attr-defined]
    assert box.client.get("/v1/conversations", headers=box.h("ann")).status_code == 401
    assert "key.revoke" in audit_actions(box)


def test_a_password_reset_ends_the_persons_sessions_and_is_told_at_their_next_login(
    box: Box,
) -> None:
    box.login("ann")
    ann_cookies = dict(box.client.cookies)
    assert box.client.get("/", follow_redirects=False).status_code == 200
    box.client.cookies.clear()
    csrf = box.login("admin")
    ann = _uid(box, "ann")
    r = post(box, f"/console/people/{ann}/password", csrf, value="ann-new-password")
    assert r.status_code == 200  # type: ignore[attr-defined]
    audit = box.client.get("/console/audit?action=user.reset_password").text
    row = re.search(r"<tr><td>.*?</tr>", audit, re.S)
    assert row and "admin" in row.group(0) and "ann" in row.group(0), audit
    assert "sessions_ended=True" in row.group(0)

    # ann's browser is signed out
    box.client.cookies.clear()
    box.client.cookies.update(ann_cookies)
    r = box.client.get("/", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login"

    # her next login tells her, once, before she goes on
    box.client.cookies.clear()
    box.passwords["ann"] = "ann-new-password"
    r = login_form(box, "ann")
    assert r.status_code == 200
    day = time.strftime("%Y-%m-%d", time.gmtime())
    assert re.search(rf"An admin reset your password on <time[^>]*>{day} ", r.text), r.text
    assert 'href="/"' in r.text and box.client.get("/").status_code == 200  # signed in
    box.client.cookies.clear()
    r = login_form(box, "ann")
    assert r.status_code == 303 and "reset your password" not in r.text


def test_usage_per_user_by_day(box: Box) -> None:
    box.complete("bob")
    box.login("admin")
    bob = _uid(box, "bob")
    usage = box.client.get(f"/console/data/usage/{bob}").json()
    assert len(usage["days"]) == 30 and usage["requests"][-1] == 1 and usage["tokens"][-1] > 0
    assert box.client.get("/console/data/usage/u_nobody").status_code == 404


def test_model_actions_take_effect_and_are_audited(box: Box, tiny_gguf: Path) -> None:
    csrf = box.login("admin")
    pool = box.client.app.state.services.models.pool
    assert post(box, "/console/models/big/load", csrf).status_code == 200  # type: ignore[attr-defined]
    assert "big" in pool.loaded()
    assert post(box, "/console/models/big/unload", csrf).status_code == 200  # type: ignore[attr-defined]
    assert "big" not in pool.loaded()
    assert post(box, "/console/models/big/default", csrf).status_code == 200  # type: ignore[attr-defined]
    registry = box.client.app.state.services.model_admin.registry
    assert registry.resolve_default().name == "big"
    r = post(box, "/console/models", csrf, path=str(tiny_gguf), name="tiny-copy")
    assert r.status_code == 200 and "tiny-copy" in r.text  # type: ignore[attr-defined]
    assert "tiny-copy" in registry.names()
    bad = post(box, "/console/models", csrf, path="/etc/hostname", name="nope")
    assert bad.status_code == 400  # type: ignore[attr-defined]
    assert post(box, "/console/models/ghost/load", csrf).status_code == 404  # type: ignore[attr-defined]
    actions = audit_actions(box)
    for action in ("model.load", "model.unload", "model.set_default", "model.add"):
        assert action in actions, (action, actions)
