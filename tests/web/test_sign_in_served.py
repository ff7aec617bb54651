"""Signing in through the team's identity provider, against a real OpenID Provider (node's
oidc-provider) and `chatbox serve`: accounts made at the first sign-in, role and tier from the
policy's [sign_in] rules at every sign-in, the protocol's checks (state, code, ID token), a
provider that cannot be reached, and an auth proxy's headers."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from joserfc import jwt
from joserfc.jwk import RSAKey

from chatbox.chat.policy import default_policy_path
from tests.oidc.op import CLIENT_SECRET, OpenIDProvider, query_of, sign_in, to_callback
from tests.served import ADMIN_PASSWORD, Served, free_port

RULES = """
[[sign_in.rule]]
group = "chatbox-admins"
role = "admin"
tier = "paid"

[[sign_in.rule]]
group = "staff"
tier = "free"
"""


def policy_with_rules(where: Path) -> Path:
    path = where / "policy-sign-in.toml"
    path.write_text(default_policy_path().read_text() + RULES)
    return path


def audit(box: Served) -> list[dict[str, Any]]:
    return list(json.loads(box.cli("audit", "list", "--limit", "500", "--json")))


def person(box: Served, name: str) -> dict[str, Any]:
    users = json.loads(box.cli("users", "list", "--json"))
    found = [u for u in users if u["name"] == name]
    assert found, [u["name"] for u in users]
    return dict(found[0])


def password_login(box: Served, name: str, password: str) -> httpx.Response:
    with httpx.Client(base_url=box.url, timeout=30) as c:
        page = c.get("/login")
        token = page.text.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
        return c.post(
            "/login",
            data={"name": name, "password": password, "csrf_token": token, "next": "/"},
        )


@pytest.fixture(scope="module")
def op_box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Any]:
    """chatbox with password login off, signing in through a real provider."""
    where = tmp_path_factory.mktemp("sign-in")
    box = Served(where, model=tiny_gguf, policy=policy_with_rules(where))
    with OpenIDProvider(where, box.url + "/auth/callback") as op:
        box.env.update(op.chatbox_env(), CHATBOX_PASSWORD_LOGIN="false")
        box.start()
        try:
            yield box, op
        finally:
            box.stop()


def test_a_first_sign_in_makes_the_account_with_the_groups_role_and_tier(op_box: Any) -> None:
    box, op = op_box
    op.person("ann", groups=["staff"], email="ann@example.com", name="Ann Example")
    login_page = httpx.get(box.url + "/login", timeout=30)
    assert "Sign in with Test ID" in login_page.text
    with httpx.Client(timeout=30) as browser:
        done = sign_in(browser, box.url, "ann", next_path="/library")
        assert done.status_code == 303, done.text
        assert done.headers["location"] == "/library"
        assert browser.get(box.url + "/").status_code == 200  # the session works
    ann = person(box, "ann")
    assert (ann["role"], ann["tier"], ann["disabled"]) == ("member", "free", False)
    actions = [(e["action"], (e["target"] or {}).get("name")) for e in audit(box)]
    assert ("user.add", "ann") in actions and ("user.sign_in", "ann") in actions
    added = next(
        e for e in audit(box) if e["action"] == "user.add" and e["target"]["name"] == "ann"
    )
    assert added["detail"]["via"] == "oidc" and added["detail"]["rule"] == "group staff"
    # The console says how each person signs in.
    with httpx.Client(base_url=box.url, timeout=30, headers=box.admin) as admin:
        people = admin.get("/console/people")
    assert people.status_code == 200, people.text
    row = people.text.split(">ann<", 1)[1].split("</tr>", 1)[0]
    assert "Test ID" in row
    # Nothing the protocol keeps secret reaches the log.
    assert CLIENT_SECRET not in box.log()
    assert "id_token" not in box.log() and "code=" not in box.log()


def test_a_wrong_state_is_refused(op_box: Any) -> None:
    box, op = op_box
    op.person("bea", groups=["staff"])
    with httpx.Client(timeout=30) as browser:
        callback = to_callback(browser, box.url, "bea")
        params = query_of(callback)
        forged = browser.get(
            box.url + "/auth/callback", params={**params, "state": params["state"] + "x"}
        )
        assert forged.status_code == 400
        assert "expired or was already used" in forged.text
        assert "chatbox_session" not in forged.cookies
        assert browser.get(box.url + "/", follow_redirects=False).status_code == 303  # to /login


def test_a_callback_from_another_browser_is_refused(op_box: Any) -> None:
    """Login CSRF: a callback URL made by someone else's sign-in does not sign this one in."""
    box, op = op_box
    op.person("mallory", groups=["staff"])
    with httpx.Client(timeout=30) as attacker, httpx.Client(timeout=30) as victim:
        callback = to_callback(attacker, box.url, "mallory")
        got = victim.get(callback)
        assert got.status_code == 400
        assert "chatbox_session" not in got.cookies


def test_a_replayed_code_is_refused(op_box: Any) -> None:
    box, op = op_box
    op.person("cy", groups=["staff"])
    with httpx.Client(timeout=30) as browser:
        callback = to_callback(browser, box.url, "cy")
        assert browser.get(callback).status_code == 303
        browser.cookies.clear()
        again = browser.get(callback)
        assert again.status_code == 400
        assert "chatbox_session" not in again.cookies


def test_a_group_change_applies_at_the_next_sign_in_and_removal_ends_access(
    op_box: Any,
) -> None:
    box, op = op_box
    op.person("dee", groups=["staff"])
    with httpx.Client(timeout=30) as browser:
        assert sign_in(browser, box.url, "dee").status_code == 303
    assert (person(box, "dee")["role"], person(box, "dee")["tier"]) == ("member", "free")
    key = box.cli("keys", "create", "--user", "dee").strip().splitlines()[-1]
    assert httpx.get(box.url + "/v1/conversations", headers=box.auth(key)).status_code == 200

    op.person("dee", groups=["staff", "chatbox-admins"])
    with httpx.Client(timeout=30) as browser:
        assert sign_in(browser, box.url, "dee").status_code == 303
    assert (person(box, "dee")["role"], person(box, "dee")["tier"]) == ("admin", "paid")
    changes = [e for e in audit(box) if (e["target"] or {}).get("name") == "dee"]
    tier = next(e for e in changes if e["action"] == "user.set_tier")
    assert (tier["detail"]["before"], tier["detail"]["after"]) == ("free", "paid")
    assert tier["detail"]["rule"] == "group chatbox-admins"

    with httpx.Client(timeout=30) as kept:  # a session from before the removal
        assert sign_in(kept, box.url, "dee").status_code == 303
        op.person("dee", groups=["contractors"])
        with httpx.Client(timeout=30) as browser:
            refused = sign_in(browser, box.url, "dee")
        assert refused.status_code == 403
        assert "not allowed to use chatbox" in refused.text
        assert "chatbox_session" not in refused.cookies
        assert kept.get(box.url + "/", follow_redirects=False).status_code == 303  # to /login
    assert person(box, "dee")["disabled"] is True
    assert httpx.get(box.url + "/v1/conversations", headers=box.auth(key)).status_code == 401
    assert any(
        e["action"] == "user.sign_in_refused" and (e["target"] or {}).get("name") == "dee"
        for e in audit(box)
    )

    op.person("dee", groups=["staff"])  # back in a group: back in, as a member again
    with httpx.Client(timeout=30) as browser:
        assert sign_in(browser, box.url, "dee").status_code == 303
    dee = person(box, "dee")
    assert (dee["disabled"], dee["role"], dee["tier"]) == (False, "member", "free")


def test_someone_in_no_allowed_group_gets_no_account(op_box: Any) -> None:
    box, op = op_box
    op.person("eve", groups=["contractors"])
    with httpx.Client(timeout=30) as browser:
        refused = sign_in(browser, box.url, "eve")
    assert refused.status_code == 403
    assert "Ask your administrator" in refused.text
    assert "eve" not in [u["name"] for u in json.loads(box.cli("users", "list", "--json"))]


def test_password_login_is_off_but_for_the_break_glass_admin(op_box: Any) -> None:
    box, _ = op_box
    box.user("fay")  # a local account with a password
    refused = password_login(box, "fay", "fay" * 2)
    assert refused.status_code == 403
    assert "Password login is off" in refused.text
    assert password_login(box, "admin", ADMIN_PASSWORD).status_code == 303  # to the chat


# -- a fake issuer: a forged ID token, an expired one, and no provider at all ---------------


class FakeIssuer:
    """Discovery, keys and a token endpoint whose ID token a test shapes (never a real one)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.issuer = f"http://127.0.0.1:{port}"
        self.key = RSAKey.generate_key(2048, parameters={"kid": "real"}, private=True)
        self.forger = RSAKey.generate_key(2048, parameters={"kid": "real"}, private=True)
        self.claims: dict[str, Any] = {}
        self.signer = self.key
        self.nonce = ""
        self.server: ThreadingHTTPServer | None = None

    def handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def answer(self, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/.well-known/openid-configuration":
                    self.answer(
                        {
                            "issuer": fake.issuer,
                            "authorization_endpoint": fake.issuer + "/auth",
                            "token_endpoint": fake.issuer + "/token",
                            "jwks_uri": fake.issuer + "/jwks",
                            "response_types_supported": ["code"],
                            "subject_types_supported": ["public"],
                            "id_token_signing_alg_values_supported": ["RS256"],
                            "code_challenge_methods_supported": ["S256"],
                        }
                    )
                elif self.path == "/jwks":
                    self.answer({"keys": [fake.key.as_dict(private=False)]})
                else:
                    self.send_response(404)
                    self.end_headers()

            def do_POST(self) -> None:
                now = int(time.time())
                claims = {
                    "iss": fake.issuer,
                    "aud": "chatbox",
                    "sub": "zed",
                    "iat": now,
                    "exp": now + 600,
                    "nonce": fake.nonce,
                    "groups": ["staff"],
                    **fake.claims,
                }
                token = jwt.encode({"alg": "RS256", "kid": "real"}, claims, fake.signer)
                self.answer({"access_token": "at", "token_type": "Bearer", "id_token": token})

        return Handler

    def __enter__(self) -> FakeIssuer:
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), self.handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def _callback_through_fake(box: Served, fake: FakeIssuer, browser: httpx.Client) -> httpx.Response:
    """Start a sign-in and come back with a code, as if the person had logged in there."""
    start = browser.get(box.url + "/login/oidc")
    assert start.status_code == 303, start.text
    sent = query_of(start.headers["location"])
    assert sent["code_challenge_method"] == "S256" and sent["nonce"] and sent["state"]
    fake.nonce = sent["nonce"]
    return browser.get(box.url + "/auth/callback", params={"state": sent["state"], "code": "c"})


@pytest.fixture(scope="module")
def fake_box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Any]:
    """chatbox pointed at a fake issuer's port (not yet listening), and trusting the auth
    proxy at 127.0.0.1 for its headers."""
    where = tmp_path_factory.mktemp("fake-issuer")
    port = free_port()
    box = Served(where, model=tiny_gguf, policy=policy_with_rules(where))
    box.env.update(
        CHATBOX_OIDC_ISSUER=f"http://127.0.0.1:{port}",
        CHATBOX_OIDC_CLIENT_ID="chatbox",
        CHATBOX_OIDC_CLIENT_SECRET="fake-secret",
        CHATBOX_TRUSTED_PROXIES="127.0.0.1/32",
        CHATBOX_TRUSTED_HEADER_USER="X-Forwarded-User",
        CHATBOX_TRUSTED_HEADER_GROUPS="X-Forwarded-Groups",
        CHATBOX_TRUSTED_HEADER_EMAIL="X-Forwarded-Email",
    )
    box.start()
    try:
        yield box, port
    finally:
        box.stop()


def test_a_provider_that_cannot_be_reached_gets_a_clear_page(fake_box: Any) -> None:
    box, _ = fake_box
    got = httpx.get(box.url + "/login/oidc", timeout=60)
    assert got.status_code == 503
    assert "could not be reached" in got.text
    assert httpx.get(box.url + "/login", timeout=30).status_code == 200  # the page itself


def test_a_forged_or_expired_id_token_is_refused(fake_box: Any) -> None:
    box, port = fake_box
    with FakeIssuer(port) as fake:
        fake.signer = fake.forger  # the right key id, the wrong key
        with httpx.Client(timeout=30) as browser:
            forged = _callback_through_fake(box, fake, browser)
        assert forged.status_code == 401, forged.text
        assert "could not be verified" in forged.text
        assert "chatbox_session" not in forged.cookies

        fake.signer = fake.key
        fake.claims = {"exp": int(time.time()) - 120, "iat": int(time.time()) - 720}
        with httpx.Client(timeout=30) as browser:
            expired = _callback_through_fake(box, fake, browser)
        assert expired.status_code == 401
        assert "expired" in expired.text

        fake.claims = {"aud": "someone-else"}
        with httpx.Client(timeout=30) as browser:
            assert _callback_through_fake(box, fake, browser).status_code == 401

        fake.claims = {}  # the same issuer signing properly: in
        with httpx.Client(timeout=30) as browser:
            good = _callback_through_fake(box, fake, browser)
            assert good.status_code == 303, good.text
            # the session lasts no longer than the ID token (600 s here)
            cookie = good.headers["set-cookie"]
            max_age = int(cookie.split("Max-Age=", 1)[1].split(";", 1)[0])
            assert 500 < max_age <= 600
    assert "fake-secret" not in box.log()


PROXY_HEADERS = {
    "X-Forwarded-User": "gus",
    "X-Forwarded-Groups": "staff, chatbox-admins",
    "X-Forwarded-Email": "gus@example.com",
}


def test_the_auth_proxys_headers_sign_in_from_the_proxy_only(fake_box: Any) -> None:
    box, _ = fake_box
    page = httpx.get(box.url + "/", headers=PROXY_HEADERS, timeout=30)
    assert page.status_code == 200, page.text
    gus = person(box, "gus")
    assert (gus["role"], gus["tier"]) == ("admin", "paid")  # the first matching rule
    # unsafe requests need the page's CSRF token (the proxy's cookie rides along anywhere)
    made = httpx.post(box.url + "/v1/conversations", headers=PROXY_HEADERS, json={}, timeout=30)
    assert made.status_code == 403
    csrf = page.text.split('"x-csrf-token": "', 1)[1].split('"', 1)[0]  # htmx sends it
    made = httpx.post(
        box.url + "/v1/conversations",
        headers={**PROXY_HEADERS, "X-CSRF-Token": csrf},
        json={},
        timeout=30,
    )
    assert made.status_code == 201, made.text

    # The same headers from an address that is not the proxy: refused, and logged.
    elsewhere = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"))
    with elsewhere:
        forged = elsewhere.get(
            box.url + "/", headers={**PROXY_HEADERS, "X-Forwarded-User": "admin"}, timeout=30
        )
    assert forged.status_code == 403
    assert "refused a X-Forwarded-User header from 127.0.0.2" in box.log()

    # Out of every allowed group: access ends at the next request's sign-in.
    gone = httpx.get(
        box.url + "/", headers={**PROXY_HEADERS, "X-Forwarded-Groups": "contractors"}, timeout=30
    )
    assert gone.status_code == 403
    assert person(box, "gus")["disabled"] is True
