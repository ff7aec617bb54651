"""Authentication: a Bearer API key or a session cookie (with a CSRF token for unsafe methods).

Unauthenticated API requests get 401 JSON; pages redirect to /login. Failed key checks and
logins are rate limited per address (and logins per account) so guessing does not pay.
"""

from __future__ import annotations

import hmac
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

from litestar import MediaType, Request, Response
from litestar.exceptions import (
    NotAuthorizedException,
    PermissionDeniedException,
    TooManyRequestsException,
)

from chatbox.store import Store, User

AnyRequest = Request[Any, Any, Any]
SESSION_COOKIE = "chatbox_session"
LOGIN_CSRF_COOKIE = "chatbox_login_csrf"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf_token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class LoginRequired(NotAuthorizedException):
    """No valid credentials: 401 JSON for the API, a redirect to /login for pages."""


class CsrfRefused(PermissionDeniedException):
    """A cookie-authenticated unsafe request without the session's CSRF token (403)."""


@dataclass
class Attempts:
    """Failures per key (an account or an address) in a sliding window."""

    limit: int
    window_s: float
    _fails: dict[str, deque[float]] = field(default_factory=dict)

    def blocked_for(self, key: str, now: float | None = None) -> float:
        """Seconds until `key` may try again (0: now)."""
        now = time.monotonic() if now is None else now
        fails = self._fails.get(key)
        if not fails:
            return 0.0
        while fails and fails[0] <= now - self.window_s:
            fails.popleft()
        if not fails:
            del self._fails[key]
            return 0.0
        return fails[0] + self.window_s - now if len(fails) >= self.limit else 0.0

    def fail(self, key: str) -> None:
        if len(self._fails) > 100_000:  # bounded memory under a spray of addresses
            self._fails.clear()
        self._fails.setdefault(key, deque(maxlen=self.limit)).append(time.monotonic())

    def clear(self, key: str) -> None:
        self._fails.pop(key, None)


@dataclass
class Guard:
    """The app's failed-login and failed-key counters."""

    accounts: Attempts
    addresses: Attempts

    def check(self, *keys: tuple[Attempts, str]) -> None:
        wait = max((a.blocked_for(k) for a, k in keys), default=0.0)
        if wait > 0:
            seconds = max(1, math.ceil(wait))
            raise TooManyRequestsException(
                f"too many failed attempts; try again in {seconds} s",
                headers={"Retry-After": str(seconds)})


def client_address(request: AnyRequest) -> str:
    return request.client.host if request.client else "unknown"


def is_secure(request: AnyRequest) -> bool:
    settings = request.app.state.settings
    proto = request.headers.get("x-forwarded-proto", request.url.scheme)
    return bool(settings.cookie_secure) or proto == "https"


def tokens_match(given: str | None, expected: str) -> bool:
    return bool(given) and hmac.compare_digest(str(given), expected)


async def authenticate(request: AnyRequest) -> User:
    """The acting user, or LoginRequired / CsrfRefused / 429."""
    state = request.app.state
    store: Store = state.store
    guard: Guard = state.auth_guard
    header = request.headers.get("authorization")
    if header:
        scheme, _, token = header.partition(" ")
        address = client_address(request)
        guard.check((guard.addresses, address))
        user = await store.keys.authenticate(token.strip()) if scheme.lower() == "bearer" else None
        if user is None:
            guard.addresses.fail(address)
            raise LoginRequired("invalid or revoked API key")
        request.state.auth_kind = "key"
        request.state.user_name = user.name
        request.state.user = user
        return user
    cookie = request.cookies.get(SESSION_COOKIE)
    session = await store.sessions.get(cookie) if cookie else None
    if session is None:
        raise LoginRequired("log in, or send an API key as Authorization: Bearer")
    if request.method not in SAFE_METHODS and not tokens_match(
            request.headers.get(CSRF_HEADER), session.csrf_token):
        raise CsrfRefused("missing or invalid CSRF token; reload the page")
    request.state.auth_kind = "session"
    request.state.csrf_token = session.csrf_token
    request.state.user_name = session.user.name
    request.state.user_role = session.user.role
    request.state.user = session.user
    return session.user


def login_required_handler(request: AnyRequest, exc: Exception) -> Response[Any]:
    """API: 401 JSON with WWW-Authenticate; htmx: HX-Redirect; pages: 303 to /login."""
    path = request.url.path
    if path.startswith("/v1/") or request.headers.get("authorization"):
        body = {"error": {"message": str(getattr(exc, "detail", exc)),
                          "type": "authentication_error"}}
        return Response(body, status_code=401, media_type=MediaType.JSON,
                        headers={"WWW-Authenticate": 'Bearer realm="chatbox"'})
    if request.headers.get("HX-Request") == "true":  # back to the page it came from
        page = urlsplit(request.headers.get("HX-Current-URL", "")).path or "/"
        return Response("", status_code=401, headers={"HX-Redirect": _login_url(page)})
    return Response("", status_code=303, headers={"Location": _login_url(path)})


def _login_url(path: str) -> str:
    return "/login" if path in ("/", "/login") else f"/login?next={quote(path)}"


def safe_next(target: str | None) -> str:
    """Only same-site paths: '/c/…' yes, '//evil' or 'https://…' no."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target
