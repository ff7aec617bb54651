"""Authentication: a Bearer API key or a session cookie (with a CSRF token for unsafe methods).

Unauthenticated API requests get 401 JSON; pages redirect to /login. Failed key checks and
logins are rate limited per address (and logins per account) so guessing does not pay.
"""

from __future__ import annotations

import hmac
from typing import Any
from urllib.parse import quote, urlsplit

from litestar import MediaType, Request, Response
from litestar.exceptions import (
    NotAuthorizedException,
    PermissionDeniedException,
    TooManyRequestsException,
)

from chatbox.accounts import AccountsService, TooManyAttempts, User
from chatbox.settings import Settings

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


def client_address(request: AnyRequest) -> str:
    return request.client.host if request.client else "unknown"


def is_secure(request: AnyRequest, settings: Settings) -> bool:
    proto = request.headers.get("x-forwarded-proto", request.url.scheme)
    return bool(settings.cookie_secure) or proto == "https"


def tokens_match(given: str | None, expected: str) -> bool:
    return bool(given) and hmac.compare_digest(str(given), expected)


def too_many(exc: TooManyAttempts) -> TooManyRequestsException:
    """A throttled attempt as 429 with Retry-After."""
    return TooManyRequestsException(str(exc), headers={"Retry-After": str(exc.retry_after)})


async def provide_user(request: AnyRequest, accounts: AccountsService) -> User:
    """The acting user: a Bearer API key, or a session cookie (CSRF-checked when unsafe).

    Raises LoginRequired, CsrfRefused, or 429 while an address is guessing keys.
    """
    throttle = accounts.throttle
    header = request.headers.get("authorization")
    if header:
        scheme, _, token = header.partition(" ")
        address = client_address(request)
        try:
            throttle.check((throttle.addresses, address))
        except TooManyAttempts as exc:
            raise too_many(exc) from exc
        user = await accounts.by_key(token.strip()) if scheme.lower() == "bearer" else None
        if user is None:
            throttle.addresses.fail(address)
            raise LoginRequired("invalid or revoked API key")
        request.state.auth_kind = "key"
        request.state.user_name = user.name
        request.state.user = user
        return user
    cookie = request.cookies.get(SESSION_COOKIE)
    session = await accounts.session(cookie) if cookie else None
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
