"""Browser login and logout: a session cookie (HttpOnly, SameSite=Lax, Secure behind TLS)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Annotated, Any

from litestar import Controller, Response, get, post
from litestar.datastructures import Cookie

from chatbox.accounts import AccountDisabled, AccountsService, TooManyAttempts
from chatbox.settings import Settings
from chatbox.web.auth import (
    CSRF_FIELD,
    LOGIN_CSRF_COOKIE,
    SESSION_COOKIE,
    AnyRequest,
    CsrfRefused,
    client_address,
    is_secure,
    safe_next,
    tokens_match,
)
from chatbox.web.deps import AccountsDep, SettingsDep
from chatbox.web.ui.helpers import FORM, html


@dataclass
class LoginForm:
    name: str = ""
    password: str = ""
    csrf_token: str = ""
    next: str = "/"


@dataclass
class LogoutForm:
    csrf_token: str = ""


def login_page(
    request: AnyRequest,
    settings: Settings,
    status: int = 200,
    error: str | None = None,
    name: str = "",
    next_path: str = "/",
    headers: dict[str, str] | None = None,
) -> Response[str]:
    token = secrets.token_urlsafe(24)
    response = html(
        request,
        "login.html",
        status,
        headers,
        error=error,
        name=name,
        next=safe_next(next_path),
        csrf_token=token,
        csrf_field=CSRF_FIELD,
        provider=settings.oidc_display_name,
        password_login=settings.password_login,
    )
    response.set_cookie(
        LOGIN_CSRF_COOKIE,
        token,
        httponly=True,
        samesite="strict",
        secure=is_secure(request, settings),
        path="/login",
        max_age=3600,
    )
    return response


class LoginController(Controller):
    include_in_schema = False

    @get("/login", name="login")
    async def login_page(
        self, request: AnyRequest, settings: SettingsDep, next: str = "/"
    ) -> Response[str]:
        return login_page(request, settings, next_path=next)

    @post("/login", status_code=303)
    async def login(
        self,
        request: AnyRequest,
        accounts: AccountsDep,
        settings: SettingsDep,
        data: Annotated[LoginForm, FORM],
    ) -> Response[Any]:
        """Check the password; on success set the session cookie and go to `next`."""
        if not tokens_match(data.csrf_token, request.cookies.get(LOGIN_CSRF_COOKIE, "")):
            return login_page(
                request, settings, 403, "The form expired; please try again.", data.name, data.next
            )
        throttle = accounts.throttle
        address = client_address(request, settings)
        name = data.name.strip()
        if not accounts.sign_ins.password_allowed(name):
            request.state.auth_failure = "password_login_off"
            return login_page(
                request,
                settings,
                403,
                f"Password login is off: please sign in with {settings.oidc_display_name}."
                if settings.oidc_display_name
                else "Password login is off: sign in through your organisation's sign-in page.",
                name,
                data.next,
            )
        pair = throttle.pair(name.lower(), address)
        try:  # refused: this address guessing this account, or spraying many
            await throttle.check((throttle.pairs, pair), (throttle.addresses, address))
        except TooManyAttempts as exc:
            request.state.auth_failure = "throttled"  # counted by the telemetry middleware
            return login_page(
                request,
                settings,
                429,
                f"Too many failed attempts: {exc}.",
                name,
                data.next,
                {"Retry-After": str(exc.retry_after)},
            )
        await throttle.slow_down(name.lower())  # an account under attack: slowed, not locked
        try:
            user = await accounts.check_password(name, data.password)
        except AccountDisabled:
            await throttle.pairs.clear(pair)  # the right password: no guess to count
            request.state.auth_failure = "disabled"
            return login_page(
                request,
                settings,
                403,
                "This account is disabled. Ask your administrator to enable it again.",
                name,
                data.next,
            )
        if user is None:
            await throttle.accounts.fail(name.lower())
            await throttle.pairs.fail(pair)
            await throttle.addresses.fail(address)
            request.state.auth_failure = "bad_password"
            return login_page(request, settings, 401, "Wrong name or password.", name, data.next)
        await throttle.pairs.clear(pair)
        token = await accounts.start_session(user)
        cookie = session_cookie(request, settings, token, int(settings.session_ttl_s))
        reset_at = await accounts.take_password_reset(user)
        if reset_at is not None:
            # Told once, before anything else: someone else chose the password just used.
            next_path = safe_next(data.next)
            told = html(request, "password_reset.html", reset_at=reset_at, next=next_path)
            told.set_cookie(cookie)
            return told
        return Response(
            "", status_code=303, headers={"Location": safe_next(data.next)}, cookies=[cookie]
        )

    @post("/logout", status_code=303, name="logout")
    async def logout(
        self,
        request: AnyRequest,
        accounts: AccountsDep,
        settings: SettingsDep,
        data: Annotated[LogoutForm, FORM],
    ) -> Response[Any]:
        """End this browser's session (the form carries the session's CSRF token)."""
        await end_session(request, accounts, data.csrf_token)
        return Response(
            "",
            status_code=303,
            headers={"Location": "/login"},
            cookies=[session_cookie(request, settings, "", 0)],
        )


def session_cookie(request: AnyRequest, settings: Settings, token: str, max_age: int) -> Cookie:
    return Cookie(
        key=SESSION_COOKIE,
        value=token,
        max_age=max_age,
        path="/",
        httponly=True,
        samesite="lax",
        secure=is_secure(request, settings),
    )


async def end_session(request: AnyRequest, accounts: AccountsService, csrf: str) -> None:
    token = request.cookies.get(SESSION_COOKIE)
    session = await accounts.session(token) if token else None
    if session is None:
        return
    if not tokens_match(csrf or request.headers.get("x-csrf-token"), session.csrf_token):
        raise CsrfRefused("missing or invalid CSRF token; reload the page")
    await accounts.end_session(str(token))
