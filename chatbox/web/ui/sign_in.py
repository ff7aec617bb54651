"""Signing in through the identity provider: /login/oidc sends the browser there, and
/auth/callback brings it back with a code that the accounts service turns into a session.

The browser that started a sign-in gets a random cookie whose hash the sign-in is kept
under beside its state, so a callback URL that someone else's sign-in made (login CSRF) is
refused here.
"""

from __future__ import annotations

import logging
import secrets
from typing import Annotated, Any

from litestar import Controller, Response, get
from litestar.exceptions import NotFoundException
from litestar.params import Parameter

from chatbox.accounts.oidc import ProviderUnreachable, SignInFailed
from chatbox.accounts.sign_in import DisabledByAdmin, NotAllowed, SignInExpired
from chatbox.settings import Settings
from chatbox.web.auth import AnyRequest, is_secure, safe_next
from chatbox.web.deps import AccountsDep, SettingsDep
from chatbox.web.ui.login import login_page, session_cookie

log = logging.getLogger("chatbox.sign_in")

BROWSER_COOKIE = "chatbox_sign_in"
CALLBACK = "/auth/callback"


def callback_url(request: AnyRequest, settings: Settings) -> str:
    """The redirect URI, exactly as registered: from the public URL when one is set."""
    base = settings.public_url or str(request.base_url)
    return base.rstrip("/") + CALLBACK


class SignInController(Controller):
    include_in_schema = False

    @get("/login/oidc", name="login_oidc")
    async def start(
        self, request: AnyRequest, accounts: AccountsDep, settings: SettingsDep, next: str = "/"
    ) -> Response[Any]:
        """Send the browser to the provider, with a fresh state, nonce and PKCE challenge."""
        sign_ins = accounts.sign_ins
        if sign_ins.oidc is None:
            raise NotFoundException("no identity provider is configured")
        browser = secrets.token_urlsafe(32)
        try:
            url = await sign_ins.start(callback_url(request, settings), safe_next(next), browser)
        except ProviderUnreachable as exc:
            log.warning("the identity provider could not be reached: %s", exc)
            return _unreachable(request, settings, next)
        response: Response[Any] = Response("", status_code=303, headers={"Location": url})
        response.set_cookie(
            BROWSER_COOKIE,
            browser,
            max_age=600,
            path=CALLBACK,
            httponly=True,
            samesite="lax",  # sent on the provider's top-level redirect back here
            secure=is_secure(request, settings),
        )
        return response

    @get(CALLBACK, name="auth_callback")
    async def callback(
        self,
        request: AnyRequest,
        accounts: AccountsDep,
        settings: SettingsDep,
        code: str = "",
        error: str = "",
        iss: str = "",
        sign_in_state: Annotated[str, Parameter(query="state")] = "",  # `state` is Litestar's
    ) -> Response[Any]:
        """Finish the sign-in: a session as long as the ID token lasts, then `next`."""
        sign_ins = accounts.sign_ins
        if sign_ins.oidc is None:
            raise NotFoundException("no identity provider is configured")
        name = sign_ins.provider_name
        if error:
            request.state.auth_failure = "provider_refused"
            return _failed(request, settings, 401, f"{name} did not sign you in ({error[:100]}).")
        try:
            done = await sign_ins.finish(
                sign_in_state, code, iss or None, request.cookies.get(BROWSER_COOKIE, "")
            )
        except SignInExpired:
            request.state.auth_failure = "bad_state"
            return _failed(
                request,
                settings,
                400,
                "This sign-in expired or was already used. Please sign in again.",
            )
        except ProviderUnreachable as exc:
            log.warning("the identity provider could not be reached: %s", exc)
            return _unreachable(request, settings, "/", 502)
        except SignInFailed as exc:
            log.warning("a sign-in through %s failed: %s", name, exc)
            request.state.auth_failure = "bad_id_token"
            return _failed(request, settings, 401, f"The sign-in could not be verified: {exc}.")
        except NotAllowed:
            request.state.auth_failure = "not_allowed"
            return _failed(
                request,
                settings,
                403,
                f"Your {name} account is not allowed to use chatbox: none of its groups is let"
                " in. Ask your administrator to add you to a group that is.",
            )
        except DisabledByAdmin:
            request.state.auth_failure = "disabled"
            return _failed(
                request,
                settings,
                403,
                "This account is disabled. Ask your administrator to enable it again.",
            )
        ttl = done.max_age_s
        response: Response[Any] = Response(
            "",
            status_code=303,
            headers={"Location": safe_next(done.next)},
            cookies=[session_cookie(request, settings, done.session_token, ttl)],
        )
        response.delete_cookie(BROWSER_COOKIE, path=CALLBACK)
        return response


def _failed(request: AnyRequest, settings: Settings, status: int, message: str) -> Response[Any]:
    response = login_page(request, settings, status, message)
    response.delete_cookie(BROWSER_COOKIE, path=CALLBACK)
    return response


def _unreachable(
    request: AnyRequest, settings: Settings, next_path: str, status: int = 503
) -> Response[Any]:
    name = settings.oidc_display_name
    return login_page(
        request,
        settings,
        status,
        f"{name} could not be reached, so signing in with it is not possible right now."
        " Please try again in a few minutes.",
        next_path=next_path,
        headers={"Retry-After": "60"} if status == 503 else None,
    )
