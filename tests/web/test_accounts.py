"""Accounts through HTTP: keys, sessions, CSRF, login rate limits, isolation, admin usage."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway import Box, gateway_box, run
from tests.sse import parse_sse


@pytest.fixture
def box(tmp_path: Path, tiny_gguf: Path) -> Iterator[Box]:
    with gateway_box(tmp_path, tiny_gguf) as b:
        yield b


def test_unauthenticated_api_is_401_json_and_pages_redirect_to_login(box: Box) -> None:
    c = box.client
    for method, path in (
        ("GET", "/v1/conversations"),
        ("POST", "/v1/conversations"),
        ("GET", "/v1/models"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/admin/usage"),
    ):
        r = c.request(method, path, json={})
        assert r.status_code == 401, (path, r.text)
        error = r.json()["error"]
        assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")
        assert r.headers["www-authenticate"].startswith("Bearer")
    r = c.get("/c/c_whatever", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login?next=/c/c_whatever"
    r = c.get("/", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login"
    r = c.post("/ui/new/send", data={"content": "hi"}, headers={"HX-Request": "true"})
    assert r.status_code == 401 and r.headers["hx-redirect"] == "/login"
    assert c.get("/healthz").status_code == 200
    bad = c.get("/v1/conversations", headers={"Authorization": "Bearer cbx-nope"})
    assert bad.status_code == 401


def test_revoked_key_and_disabled_user_stop_working_at_once(box: Box) -> None:
    c = box.client
    assert c.get("/v1/conversations", headers=box.h("ann")).status_code == 200
    store = c.app.state.services.store

    async def revoke() -> None:
        ann = await store.users.get_by_name("ann")
        (key,) = await store.keys.list(ann.id)
        await store.keys.revoke(key.id)

    with c.portal() as portal:
        portal.call(revoke)
    assert c.get("/v1/conversations", headers=box.h("ann")).status_code == 401

    assert c.get("/v1/conversations", headers=box.h("bob")).status_code == 200
    with c.portal() as portal:
        portal.call(_disable, store, "bob")
    assert c.get("/v1/conversations", headers=box.h("bob")).status_code == 401


async def _disable(store: object, name: str) -> None:
    user = await store.users.get_by_name(name)  # type: ignore[attr-defined]
    await store.users.set_disabled(user.id, True)  # type: ignore[attr-defined]


def test_login_sets_a_hardened_session_cookie_and_logout_ends_it(box: Box) -> None:
    c = box.client
    csrf = box.login("ann")
    cookie = next(h for h in c.cookies.jar if h.name == "chatbox_session")
    assert cookie.has_nonstandard_attr("HttpOnly")
    raw = [v for k, v in c.get("/login").headers.multi_items() if k == "set-cookie"]
    assert any("samesite=strict" in v.lower() and "httponly" in v.lower() for v in raw)
    assert c.get("/").status_code == 200
    assert c.get("/v1/conversations").status_code == 200  # the cookie works for the API too
    r = c.post("/logout", data={"csrf_token": csrf}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert c.get("/", follow_redirects=False).status_code == 303


def test_session_cookie_is_secure_behind_tls(box: Box) -> None:
    """Secure when the app is told so (behind a trusted proxy: tests/web/test_lockout.py)."""
    c = box.client
    page = c.get("/login")
    token = page.text.split('name="csrf_token" value="')[1].split('"')[0]
    r = c.post(
        "/login",
        data={"name": "ann", "password": box.passwords["ann"], "csrf_token": token, "next": "/"},
        headers={"X-Forwarded-Proto": "https"},
        follow_redirects=False,
    )
    assert "secure" not in r.headers["set-cookie"].lower()  # a header anyone can send
    c.cookies.clear()
    c.base_url = c.base_url.copy_with(scheme="https")
    page = c.get("/login")
    token = page.text.split('name="csrf_token" value="')[1].split('"')[0]
    r = c.post(
        "/login",
        data={"name": "ann", "password": box.passwords["ann"], "csrf_token": token, "next": "/"},
        follow_redirects=False,
    )
    set_cookie = r.headers["set-cookie"].lower()
    assert "chatbox_session=" in set_cookie
    assert "secure" in set_cookie and "httponly" in set_cookie and "samesite=lax" in set_cookie


def test_csrf_is_required_for_cookie_requests_and_not_for_bearer(box: Box) -> None:
    c = box.client
    csrf = box.login("ann")
    assert c.post("/v1/conversations", json={}).status_code == 403
    assert (
        c.post("/v1/conversations", json={}, headers={"x-csrf-token": "forged"}).status_code == 403
    )
    r = c.post("/ui/new/send", data={"content": "hi"}, headers={"HX-Request": "true"})
    assert r.status_code == 403
    r = c.post("/v1/conversations", json={}, headers={"x-csrf-token": csrf})
    assert r.status_code == 201
    conv = r.json()["id"]
    assert c.delete(f"/v1/conversations/{conv}").status_code == 403
    assert c.post(f"/ui/c/{conv}/delete", headers={"HX-Request": "true"}).status_code == 403
    assert c.post("/logout", data={"csrf_token": "forged"}).status_code == 403
    # A Bearer key is not ambient authority: no CSRF token needed.
    c.cookies.clear()
    assert c.post("/v1/conversations", json={}, headers=box.h("ann")).status_code == 201
    # The login form itself carries a token bound to a cookie.
    r = c.post(
        "/login",
        data={"name": "ann", "password": box.passwords["ann"], "csrf_token": "x", "next": "/"},
        follow_redirects=False,
    )
    assert r.status_code == 403


def test_failed_logins_are_rate_limited_per_account_and_address(box: Box) -> None:
    c = box.client

    def attempt(name: str, password: str, address: str = "10.0.0.1") -> int:
        page = c.get("/login")
        token = page.text.split('name="csrf_token" value="')[1].split('"')[0]
        r = c.post(
            "/login",
            data={"name": name, "password": password, "csrf_token": token, "next": "/"},
            follow_redirects=False,
        )
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) > 0
            assert "Too many failed attempts" in r.text
        return r.status_code

    assert [attempt("ann", "wrong") for _ in range(5)] == [401] * 5
    assert attempt("ann", box.passwords["ann"]) == 429  # locked, even with the right password
    assert attempt("bob", box.passwords["bob"]) == 303  # other accounts are unaffected
    c.cookies.clear()
    for i in range(15):
        assert attempt(f"nobody{i}", "x") == 401
    assert attempt("carol", "wrong") == 429  # the address has used up its 20 failures


def test_login_next_only_goes_to_local_paths(box: Box) -> None:
    c = box.client
    page = c.get("/login?next=//evil.example/x")
    assert 'value="/"' in page.text
    token = page.text.split('name="csrf_token" value="')[1].split('"')[0]
    r = c.post(
        "/login",
        data={
            "name": "ann",
            "password": box.passwords["ann"],
            "csrf_token": token,
            "next": "https://evil.example",
        },
        follow_redirects=False,
    )
    assert r.headers["location"] == "/"


OPEN_REDIRECTS = [
    "//evil.example",
    "///evil.example",
    "/\t/evil.example",
    "/\n/evil.example",
    "/\r\n/evil.example",
    "/ /evil.example",
    "/\x00/evil.example",
    "/\x0b/evil.example",
    "\\evil.example",
    "/\\evil.example",
    "/\\/evil.example",
    "\\/evil.example",
    "https://evil.example",
    "http:/evil.example",
    "javascript:alert(1)",
    "evil.example",
    "/%2F/evil.example",
    "/%2f%2fevil.example",
    "/%5Cevil.example",
    "/%09/evil.example",
    "/.//evil.example",
    "/./../evil.example",
    "/\u3000/evil.example",
    "/\xa0/evil.example",
    "/\u2028/evil.example",
    " //evil.example",
    "\t//evil.example",
    "",
    "c/x",
]


@pytest.mark.parametrize("target", OPEN_REDIRECTS)
def test_safe_next_refuses_anything_but_a_local_path(target: str) -> None:
    from chatbox.web.auth import safe_next

    assert safe_next(target) == "/"


@pytest.mark.parametrize(
    "target",
    [
        "/",
        "/memory",
        "/library/",
        "/c/c_1?turn=t_2&q=a%20b",
        "/c/c_1?turn=t_2#turn-t_2",
        "/admin/usage",
    ],
)
def test_safe_next_keeps_local_paths(target: str) -> None:
    from chatbox.web.auth import safe_next

    assert safe_next(target) == target


def test_login_next_never_leaves_the_site(box: Box) -> None:
    c = box.client
    for target in OPEN_REDIRECTS:
        c.cookies.clear()
        page = c.get("/login")
        token = page.text.split('name="csrf_token" value="')[1].split('"')[0]
        r = c.post(
            "/login",
            data={
                "name": "ann",
                "password": box.passwords["ann"],
                "csrf_token": token,
                "next": target,
            },
            follow_redirects=False,
        )
        assert r.status_code == 303 and r.headers["location"] == "/", (target, r.headers)


def _ann_conversation(box: Box) -> tuple[str, str, str]:
    conv = box.new_conversation("ann", title="ann's secret")
    r = box.client.post(
        f"/v1/conversations/{conv}/turns", json={"content": "my secret"}, headers=box.h("ann")
    )
    events = list(parse_sse(iter(r.text.split("\n"))))
    start = events[0].json()
    return conv, start["user_turn_id"], start["turn_id"]


def test_isolation_matrix_every_endpoint_is_404_for_another_user(box: Box) -> None:
    c = box.client
    conv, user_turn, answer = _ann_conversation(box)
    hx = {"HX-Request": "true"}
    cases = [
        ("GET", f"/v1/conversations/{conv}", None, None),
        ("PATCH", f"/v1/conversations/{conv}", {"title": "pwned"}, None),
        ("DELETE", f"/v1/conversations/{conv}", None, None),
        ("POST", f"/v1/conversations/{conv}/turns", {"content": "x"}, None),
        ("POST", f"/v1/conversations/{conv}/turns/{user_turn}/edit", {"content": "x"}, None),
        ("POST", f"/v1/conversations/{conv}/turns/{answer}/regenerate", {}, None),
        ("GET", f"/v1/conversations/{conv}/turns/{answer}/events", None, None),
        ("POST", f"/v1/conversations/{conv}/branch", {"turn_id": user_turn}, None),
        ("POST", f"/v1/conversations/{conv}/cancel", None, None),
        ("GET", f"/c/{conv}", None, None),
        ("POST", f"/ui/c/{conv}/send", None, {"content": "x"}),
        ("POST", f"/ui/c/{conv}/stop", None, {}),
        ("POST", f"/ui/c/{conv}/turns/{answer}/regenerate", None, {}),
        ("GET", f"/ui/c/{conv}/turns/{user_turn}", None, None),
        ("GET", f"/ui/c/{conv}/turns/{user_turn}/edit", None, None),
        ("POST", f"/ui/c/{conv}/turns/{user_turn}/edit", None, {"content": "x"}),
        ("POST", f"/ui/c/{conv}/branch", None, {"turn_id": user_turn}),
        ("POST", f"/ui/c/{conv}/settings", None, {"title": "pwned"}),
        ("POST", f"/ui/c/{conv}/delete", None, {}),
    ]
    for other in ("bob", "admin"):  # admins see usage, not content
        for method, path, body, form in cases:
            headers = box.h(other, **(hx if path.startswith("/ui/") else {}))
            r = c.request(method, path, json=body, data=form, headers=headers)
            assert r.status_code == 404, (other, method, path, r.status_code, r.text[:200])
            assert "my secret" not in r.text and "ann's secret" not in r.text
        # The bubble's SSE ends with the same frame as for an id that never existed.
        stream = c.get(f"/ui/c/{conv}/turns/{answer}/stream", headers=box.h(other))
        nowhere = c.get(f"/ui/c/c_nope/turns/{answer}/stream", headers=box.h(other))
        assert stream.text.replace(conv, "c_nope") == nowhere.text
        assert "no longer available" in stream.text and "my secret" not in stream.text
        listing = c.get("/v1/conversations", headers=box.h(other)).json()["data"]
        assert conv not in [x["id"] for x in listing]
    view = c.get(f"/v1/conversations/{conv}", headers=box.h("ann")).json()
    assert view["title"] == "ann's secret"
    assert view["turns"][0]["content"] == "my secret"
    assert view["running_turn_id"] is None


def test_admin_sees_usage_but_members_do_not(box: Box) -> None:
    c = box.client
    _ann_conversation(box)
    assert box.complete("bob").status_code == 200
    r = c.get("/v1/admin/usage", headers=box.h("admin"))
    assert r.status_code == 200
    users = {u["user"]: u for u in r.json()["users"]}
    assert users["ann"]["requests"] == 1 and users["ann"]["total_tokens"] > 0
    assert users["bob"]["tier"] == "paid"
    rows = r.json()["data"]
    assert {row["model"] for row in rows if row["user"] == "bob"} == {"big"}
    assert "my secret" not in r.text
    assert c.get("/v1/admin/usage", headers=box.h("ann")).status_code == 403
    page = c.get("/admin/usage", headers=box.h("admin"))
    assert page.status_code == 200 and "ann" in page.text
    assert c.get("/admin/usage", headers=box.h("bob")).status_code == 403


def test_first_start_creates_an_admin_once(tmp_path: Path, tiny_gguf: Path) -> None:
    from chatbox.accounts import ensure_admin
    from chatbox.store import Store
    from tests.conftest import test_settings

    settings = test_settings(tmp_path / "d", admin_password=None)

    async def go() -> list[str]:
        settings.ensure_dirs()
        store = await Store.open(settings.database)
        await ensure_admin(store, settings)
        await ensure_admin(store, settings)
        names = [u.name for u in await store.users.list()]
        await store.close()
        return names

    assert run(go()) == ["admin"]


def test_guessing_api_keys_is_rate_limited_per_address(box: Box) -> None:
    c = box.client
    for i in range(20):
        r = c.get("/v1/conversations", headers={"Authorization": f"Bearer cbx-guess{i}"})
        assert r.status_code == 401
    r = c.get("/v1/conversations", headers={"Authorization": "Bearer cbx-guess-more"})
    assert r.status_code == 429 and int(r.headers["retry-after"]) > 0
    # a valid key from that address still works: it is checked before the counter
    assert c.get("/v1/conversations", headers=box.h("ann")).status_code == 200
