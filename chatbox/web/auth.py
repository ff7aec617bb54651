"""Authentication: a Bearer API key or a session cookie (with a CSRF token for unsafe methods).

Unauthenticated API requests get 401 JSON; pages redirect to /login. Failed key checks and
logins are rate limited per address (and logins per account) so guessing does not pay.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Callable
from functools import lru_cache
from ipaddress import IPv4Network, IPv6Network
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from litestar import MediaType, Request, Response
from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException, PermissionDeniedException
from litestar.handlers import BaseRouteHandler
from litestar.types import Guard

from chatbox.accounts import AccountsService, TooManyAttempts, User
from chatbox.accounts.sign_in import DisabledByAdmin, NotAllowed
from chatbox.chat import RateLimited
from chatbox.data import RETENTION_HEADER, ask_retention
from chatbox.settings import Settings
from chatbox.web.errors import error_body

AnyRequest = Request[Any, Any, Any]
SESSION_COOKIE = "chatbox_session"
LOGIN_CSRF_COOKIE = "chatbox_login_csrf"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf_token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
IPNetwork = IPv4Network | IPv6Network
ADMIN_API = "/v1/admin/"
_AUTHENTICATED = "authenticated_user"  # request.state key: the user the guard found
log = logging.getLogger("chatbox.auth")


class LoginRequired(NotAuthorizedException):
    """No valid credentials: 401 JSON for the API, a redirect to /login for pages."""


class CsrfRefused(PermissionDeniedException):
    """A cookie-authenticated unsafe request without the session's CSRF token (403)."""


@lru_cache(maxsize=8)
def _networks(cidrs: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(c, strict=False) for c in cidrs)


def _trusted(host: str, settings: Settings) -> bool:
    """Whether `host` (an address) is one of the configured reverse proxies."""
    if not settings.trusted_proxies:
        return False
    try:
        ip = ipaddress.ip_address(host.strip())
    except ValueError:
        return False
    return any(ip in net for net in _networks(tuple(settings.trusted_proxies)))


def _peer(request: AnyRequest) -> str:
    return request.client.host if request.client else "unknown"


def client_address(request: AnyRequest, settings: Settings) -> str:
    """The client's address: the peer, or from X-Forwarded-For when the peer is a trusted
    proxy (the nearest hop that is not itself a trusted proxy; the header's left end is
    whatever the client wrote, so it is read right to left)."""
    address = _peer(request)
    if not _trusted(address, settings):
        return address
    hops = [
        h.strip()
        for v in request.headers.getall("x-forwarded-for", [])
        for h in v.split(",")
        if h.strip()
    ]
    for hop in reversed(hops):
        try:
            address = str(ipaddress.ip_address(hop))
        except ValueError:
            break  # a forged or garbled entry: trust nothing to its left
        if not _trusted(address, settings):
            break
    return address


def is_secure(request: AnyRequest, settings: Settings) -> bool:
    """HTTPS to the client: TLS here, or X-Forwarded-Proto from a trusted proxy."""
    if settings.cookie_secure or request.url.scheme == "https":
        return True
    if not _trusted(_peer(request), settings):
        return False
    proto = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    return proto == "https"


def tokens_match(given: str | None, expected: str) -> bool:
    """Constant-time, on UTF-8 bytes (`compare_digest` refuses str with non-ASCII)."""
    return bool(given) and hmac.compare_digest(
        str(given).encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
    )


def too_many(exc: TooManyAttempts) -> RateLimited:
    """A throttled attempt as 429 with Retry-After, in the same body as every other rate
    limit (`limit`/`code` "attempts")."""
    return RateLimited(str(exc), exc.retry_after, kind="attempts")


async def provide_user(request: AnyRequest, accounts: AccountsService, settings: Settings) -> User:
    """The acting user: a Bearer API key, or a session cookie (CSRF-checked when unsafe).

    Raises LoginRequired, CsrfRefused, or 429 while an address is guessing keys. A valid
    key is checked first and never refused for the failures of others at its address.
    The guard `authenticate_first` has usually found the user already.
    """
    known = request.state.get(_AUTHENTICATED)
    if isinstance(known, User):
        return known
    throttle = accounts.throttle
    header = request.headers.get("authorization")
    if header:
        scheme, _, token = header.partition(" ")
        user = await accounts.by_key(token.strip()) if scheme.lower() == "bearer" else None
        if user is None:
            address = client_address(request, settings)
            try:
                await throttle.check((throttle.addresses, address))
            except TooManyAttempts as exc:
                request.state.auth_failure = "throttled"  # counted by the telemetry middleware
                raise too_many(exc) from exc
            await throttle.addresses.fail(address)
            request.state.auth_failure = "invalid_key"
            raise LoginRequired("invalid or revoked API key")
        request.state.auth_kind = "key"
        request.state.user_name = user.name
        request.state.user = user
        request.state[_AUTHENTICATED] = user
        return user
    if settings.trusted_header_user and request.headers.get(settings.trusted_header_user):
        return await _proxy_user(request, accounts, settings)
    cookie = request.cookies.get(SESSION_COOKIE)
    session = await accounts.session(cookie) if cookie else None
    if session is None:
        request.state.auth_failure = "expired_session" if cookie else "no_credentials"
        raise LoginRequired("log in, or send an API key as Authorization: Bearer")
    if request.method not in SAFE_METHODS and not tokens_match(
        request.headers.get(CSRF_HEADER), session.csrf_token
    ):
        request.state.auth_failure = "csrf"
        raise CsrfRefused("missing or invalid CSRF token; reload the page")
    request.state.auth_kind = "session"
    request.state.csrf_token = session.csrf_token
    request.state.user_name = session.user.name
    request.state.user_role = session.user.role
    request.state.user = session.user
    request.state[_AUTHENTICATED] = session.user
    return session.user


async def _proxy_user(request: AnyRequest, accounts: AccountsService, settings: Settings) -> User:
    """The person an auth proxy's headers name: believed only from a configured proxy
    address (the direct peer, never a forwarded one); anyone else sending them is refused."""
    assert settings.trusted_header_user
    peer = _peer(request)
    if not _trusted(peer, settings):
        log.warning(
            "refused a %s header from %s: not one of the trusted proxies",
            settings.trusted_header_user,
            peer,
        )
        request.state.auth_failure = "untrusted_proxy"
        raise PermissionDeniedException("sign-in headers are accepted only from the auth proxy")
    subject = request.headers.get(settings.trusted_header_user, "").strip()
    raw = (
        request.headers.get(settings.trusted_header_groups, "")
        if settings.trusted_header_groups
        else ""
    )
    groups = tuple(g.strip() for g in raw.split(",") if g.strip())
    email = (
        request.headers.get(settings.trusted_header_email, "").strip() or None
        if settings.trusted_header_email
        else None
    )
    try:
        identity = await accounts.sign_ins.proxy_user(subject, groups, email)
    except NotAllowed as exc:
        request.state.auth_failure = "not_allowed"
        raise PermissionDeniedException(
            f"Your account is not allowed to use chatbox: {exc}. Ask your administrator."
        ) from exc
    except DisabledByAdmin as exc:
        request.state.auth_failure = "disabled"
        raise PermissionDeniedException(
            "This account is disabled. Ask your administrator to enable it again."
        ) from exc
    # The proxy's own cookie rides along on any cross-site request: unsafe ones need the
    # page's CSRF token, as a session's do.
    if request.method not in SAFE_METHODS and not tokens_match(
        request.headers.get(CSRF_HEADER), identity.csrf_token
    ):
        request.state.auth_failure = "csrf"
        raise CsrfRefused("missing or invalid CSRF token; reload the page")
    user = identity.user
    request.state.auth_kind = "proxy"
    request.state.csrf_token = identity.csrf_token
    request.state.user_name = user.name
    request.state.user_role = user.role
    request.state.user = user
    request.state[_AUTHENTICATED] = user
    return user


def bearer_key(request: AnyRequest) -> str | None:
    """The API key a request authenticated with (None for a browser session)."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def authenticate_first(accounts: Callable[[], AccountsService], settings: Settings) -> Guard:
    """A guard for every route that takes the acting `user`: credentials are checked before
    its parameters or body are, so an anonymous caller gets 401, never a validation error;
    and a member gets 403 on the admin API before anything else is looked at."""

    async def guard(
        connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
    ) -> None:
        if not isinstance(connection, Request):
            return
        if "user" not in handler.parsed_fn_signature.parameters:
            return
        user = await provide_user(connection, accounts(), settings)
        if connection.url.path.startswith(ADMIN_API) and user.role != "admin":
            raise PermissionDeniedException("only admins can use the admin API")
        ask_retention(connection.headers.get(RETENTION_HEADER), bearer_key(connection))

    return guard


def login_required_handler(request: AnyRequest, exc: Exception) -> Response[Any]:
    """API: 401 JSON with WWW-Authenticate; htmx: HX-Redirect; pages: 303 to /login."""
    path = request.url.path
    if path.startswith("/v1/") or request.headers.get("authorization"):
        message = str(getattr(exc, "detail", exc))
        body = error_body(message, "invalid_request_error", param=None, code="invalid_api_key")
        return Response(
            body,
            status_code=401,
            media_type=MediaType.JSON,
            headers={"WWW-Authenticate": 'Bearer realm="chatbox"'},
        )
    if request.headers.get("HX-Request") == "true":  # back to the page it came from
        page = urlsplit(request.headers.get("HX-Current-URL", "")).path or "/"
        return Response("", status_code=401, headers={"HX-Redirect": _login_url(page)})
    return Response("", status_code=303, headers={"Location": _login_url(path)})


def _login_url(path: str) -> str:
    return "/login" if path in ("/", "/login") else f"/login?next={quote(path)}"


def safe_next(target: str | None) -> str:
    """Only same-site paths: '/c/…' yes; '//evil', 'https://…', '/\\t/evil', '/\\\\evil' no.

    Browsers drop tabs and newlines from URLs and read '\\' as '/', so only printable ASCII
    without a backslash is accepted, and what is left must parse as a path (no scheme, no
    host) with no empty, '.' or '..' segment, percent-encoded slashes included.
    """
    if not target or len(target) > 2048 or not target.startswith("/"):
        return "/"
    if any(not 0x21 <= ord(ch) <= 0x7E or ch == "\\" for ch in target):
        return "/"
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path.startswith("/"):
        return "/"
    # the path as written: urlsplit reads '///x' as an empty host and the path '/x'
    decoded = unquote(target.split("#", 1)[0].split("?", 1)[0], errors="replace")
    if any(ch.isspace() or not ch.isprintable() or ch == "\\" for ch in decoded):
        return "/"
    if "//" in decoded or any(s in (".", "..") for s in decoded.split("/")):
        return "/"
    return target
