"""The accounts service: users, browser sessions, API keys and usage reports."""

from __future__ import annotations

import secrets
import sys
from typing import Any

from chatbox.accounts.throttle import Attempts, LoginThrottle
from chatbox.accounts.usage import usage_report
from chatbox.settings import Settings
from chatbox.store import Session, Store, User


class AccountsService:
    """Who is acting: password and key checks, sessions, and the users admins manage."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self.throttle = LoginThrottle(
            Attempts(settings.login_max_failures, settings.login_window_s),
            Attempts(settings.login_max_failures_per_address, settings.login_window_s))

    async def user(self, user_id: str) -> User | None:
        return await self.store.users.get(user_id)

    async def by_key(self, secret: str) -> User | None:
        """The enabled user owning this unrevoked API key."""
        return await self.store.keys.authenticate(secret)

    async def session(self, token: str) -> Session | None:
        """The live session behind a cookie token."""
        return await self.store.sessions.get(token)

    async def check_password(self, name: str, password: str) -> User | None:
        return await self.store.users.check_password(name, password)

    async def start_session(self, user: User) -> str:
        """A new browser session for `user`; the cookie token."""
        token, _ = await self.store.sessions.create(user.id, self.settings.session_ttl_s)
        return token

    async def end_session(self, token: str) -> None:
        await self.store.sessions.delete(token)

    async def usage(self, since: str | None, name: str | None) -> dict[str, Any]:
        """Requests and tokens per user, model, day and arm (never content)."""
        return await usage_report(self.store, since, name)

    async def ensure_admin(self) -> None:
        await ensure_admin(self.store, self.settings)


async def ensure_admin(store: Store, settings: Settings) -> None:
    """First start with no accounts: create the admin (taking over the local user's data).

    The password comes from settings.admin_password, or is generated and printed once.
    """
    if await store.users.count() > 0:
        return
    password = settings.admin_password or secrets.token_urlsafe(12)
    local = await store.users.get_by_name("local")
    if local is not None:
        await store.users.rename(local.id, settings.admin_name)
        await store.users.set_role(local.id, "admin")
        await store.users.set_tier(local.id, "paid")
        await store.users.set_password(local.id, password)
    else:
        await store.users.create(settings.admin_name, role="admin", tier="paid",
                                 password=password)
    if settings.admin_password:
        print(f"chatbox: created the admin account {settings.admin_name!r} with the given "
              "password", file=sys.stderr, flush=True)
    else:
        print(f"chatbox: created the admin account {settings.admin_name!r}; log in at "
              f"http://{settings.host}:{settings.port}/login with password: {password}\n"
              "  (shown once; change it with `chatbox users reset-password "
              f"{settings.admin_name}`)", file=sys.stderr, flush=True)
