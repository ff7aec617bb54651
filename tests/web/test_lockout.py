"""Failed attempts slow the attacker, never deny the owner; proxies are believed only if trusted."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import transport

from tests.gateway import Box, gateway_box

PROXY = "10.9.0.1"  # in the trusted range below


@pytest.fixture
def box(tmp_path: Path, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Box]:
    """A box behind a trusted proxy range, whose test client can pose as any peer
    (the `X-Test-Peer` header becomes the connection's address)."""
    original = transport.TestClientTransport.parse_request

    def parse(self: Any, request: Any) -> dict[str, Any]:
        peer = request.headers.pop("x-test-peer", None)
        scope = original(self, request)
        if peer:
            scope["client"] = (peer, 50000)
        return scope

    monkeypatch.setattr(transport.TestClientTransport, "parse_request", parse)
    with gateway_box(
        tmp_path, tiny_gguf, trusted_proxies=("10.9.0.0/16",), login_slowdown_s=0.3
    ) as b:
        yield b


def login(box: Box, name: str, password: str, **headers: str) -> Any:
    c = box.client
    c.cookies.clear()
    page = c.get("/login", headers=headers)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert token, page.text
    # The form's cookie as a browser on the proxy's https:// would send it (httpx, on
    # http://testserver, keeps back a Secure one).
    cookie = f"chatbox_login_csrf={page.cookies['chatbox_login_csrf']}"
    return c.post(
        "/login",
        data={"name": name, "password": password, "csrf_token": token.group(1), "next": "/"},
        headers={**headers, "Cookie": cookie},
        follow_redirects=False,
    )


def peer(address: str, **extra: str) -> dict[str, str]:
    return {"X-Test-Peer": address, **extra}


def test_a_valid_key_is_never_refused_for_others_bad_keys(box: Box) -> None:
    c = box.client
    bad = {"Authorization": "Bearer cbx-guess", "X-Test-Peer": "192.0.2.7"}
    codes = [c.get("/v1/conversations", headers=bad).status_code for _ in range(21)]
    assert codes == [401] * 20 + [429]  # guessing from that address is still refused
    ann = box.h("ann", **peer("192.0.2.7"))
    assert c.get("/v1/conversations", headers=ann).status_code == 200
    assert c.get("/v1/conversations", headers=bad).status_code == 429


def test_the_owner_logs_in_while_someone_else_guesses_the_password(box: Box) -> None:
    attacker, owner = peer("198.51.100.66"), peer("203.0.113.10")
    assert [login(box, "admin", "wrong", **attacker).status_code for _ in range(5)] == [401] * 5
    # The guesser's address is refused for this account, even with the right password ...
    assert login(box, "admin", box.passwords["admin"], **attacker).status_code == 429
    # ... the owner elsewhere logs in, after a short delay while the account is under attack.
    started = time.monotonic()
    r = login(box, "admin", box.passwords["admin"], **owner)
    assert r.status_code == 303 and r.headers["location"] == "/", r.text
    assert time.monotonic() - started >= 0.3
    # Another account from the guesser's address is not locked.
    assert login(box, "ann", box.passwords["ann"], **attacker).status_code == 303


def test_an_address_spraying_accounts_is_refused(box: Box) -> None:
    sprayer = peer("198.51.100.67")
    for i in range(20):
        assert login(box, f"nobody{i}", "x", **sprayer).status_code == 401
    r = login(box, "carol", "wrong", **sprayer)
    assert r.status_code == 429 and int(r.headers["retry-after"]) > 0
    assert login(box, "carol", box.passwords["carol"], **peer("198.51.100.68")).status_code == 303


def test_x_forwarded_for_is_ignored_from_an_untrusted_peer(box: Box) -> None:
    c = box.client
    for i in range(20):  # a new forged X-Forwarded-For each time: still one address
        r = c.get(
            "/v1/conversations",
            headers={
                "Authorization": "Bearer cbx-guess",
                "X-Test-Peer": "192.0.2.50",
                "X-Forwarded-For": f"172.16.0.{i}",
            },
        )
        assert r.status_code == 401
    r = c.get(
        "/v1/conversations",
        headers={
            "Authorization": "Bearer cbx-guess",
            "X-Test-Peer": "192.0.2.50",
            "X-Forwarded-For": "172.16.1.1",
        },
    )
    assert r.status_code == 429


def test_x_forwarded_for_from_a_trusted_proxy_names_the_client(box: Box) -> None:
    c = box.client
    via = {"Authorization": "Bearer cbx-guess", "X-Test-Peer": PROXY}
    for _ in range(20):  # the client's own forged entry (left) does not help it
        r = c.get(
            "/v1/conversations",
            headers={**via, "X-Forwarded-For": "1.2.3.4, 198.51.100.1, 10.9.0.2"},
        )
        assert r.status_code == 401
    assert (
        c.get(
            "/v1/conversations", headers={**via, "X-Forwarded-For": "5.6.7.8, 198.51.100.1"}
        ).status_code
        == 429
    )
    # another client behind the same proxy is not blocked
    assert (
        c.get("/v1/conversations", headers={**via, "X-Forwarded-For": "198.51.100.2"}).status_code
        == 401
    )


def test_session_cookie_is_secure_only_behind_a_trusted_tls_proxy(box: Box) -> None:
    tls = {"X-Forwarded-Proto": "https"}
    trusted = login(box, "ann", box.passwords["ann"], **peer(PROXY, **tls))
    set_cookie = trusted.headers["set-cookie"].lower()
    assert "chatbox_session=" in set_cookie
    assert "secure" in set_cookie and "httponly" in set_cookie and "samesite=lax" in set_cookie
    untrusted = login(box, "ann", box.passwords["ann"], **peer("192.0.2.9", **tls))
    assert untrusted.status_code == 303
    assert "secure" not in untrusted.headers["set-cookie"].lower()


def test_trusted_proxies_and_metrics_token_come_from_the_environment() -> None:
    from chatbox.settings import settings_from_env

    s = settings_from_env(
        {
            "CHATBOX_TRUSTED_PROXIES": "127.0.0.1, 10.0.0.0/8,,fd00::/8",
            "CHATBOX_METRICS_TOKEN": "t0ken",
        }
    )
    assert s.trusted_proxies == ("127.0.0.1", "10.0.0.0/8", "fd00::/8")
    assert s.metrics_token == "t0ken" and "t0ken" not in repr(s)
    assert settings_from_env({}).trusted_proxies == ()
    with pytest.raises(ValueError):
        settings_from_env({"CHATBOX_TRUSTED_PROXIES": "10.0.0.0/33"})
