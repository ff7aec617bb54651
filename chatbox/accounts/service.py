"""The accounts service: users, browser sessions, API keys and usage reports."""

from __future__ import annotations

import logging
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from chatbox.accounts.audit import SYSTEM, Actor, AuditLog, UserAdmin
from chatbox.accounts.sign_in import SignIns
from chatbox.accounts.throttle import Attempts, LoginThrottle
from chatbox.accounts.usage import usage_report
from chatbox.observability.logs import notice
from chatbox.settings import Settings
from chatbox.store import ApiKey, AuditEntry, Session, Store, User
from chatbox.store.db import act_for

log = logging.getLogger("chatbox.accounts")

ADMIN_PASSWORD_FILE = "admin-password.txt"  # in the data directory, mode 0600


class AccountDisabled(Exception):
    """The password was right, but an admin has disabled the account."""


class AccountsService:
    """Who is acting: password and key checks, sessions, and the users admins manage."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self.audit = AuditLog(store)
        counters = store.counters  # every front's on PostgreSQL
        window = settings.login_window_s
        self.throttle = LoginThrottle(
            Attempts(settings.login_max_failures, window, "accounts", counters),
            Attempts(settings.login_max_failures_per_address, window, "addresses", counters),
            Attempts(settings.login_max_failures, window, "pairs", counters),
            settings.login_slowdown_s,
        )
        self.sign_ins = SignIns(store, settings, self.audit)  # a provider's or a proxy's

    async def user(self, user_id: str) -> User | None:
        return await self.store.users.get(user_id)

    async def by_name(self, name: str) -> User | None:
        return await self.store.users.get_by_name(name)

    async def users(self) -> list[User]:
        """Every account, as admins list them."""
        return await self.store.users.list()

    async def keys(self, user: User | None = None) -> list[ApiKey]:
        """The API keys of `user` (every user's when None), revoked ones included."""
        return await self.store.keys.list(user.id if user else None)

    async def by_key(self, secret: str) -> User | None:
        """The enabled user owning this unrevoked API key; the task's store work is theirs
        from here on (a read replica serves their reads once it holds their writes)."""
        user = await self.store.keys.authenticate(secret)
        if user is not None:
            act_for(user.id)
        return user

    async def session(self, token: str) -> Session | None:
        """The live session behind a cookie token; its user acts from here on (as `by_key`)."""
        session = await self.store.sessions.get(token)
        if session is not None:
            act_for(session.user.id)
        return session

    async def check_password(self, name: str, password: str) -> User | None:
        """The enabled user the name and password belong to; None when they do not match.

        Raises AccountDisabled only after the right password: that an account exists and is
        disabled is told to whoever holds its password, never to a guesser."""
        user = await self.store.users.verify_password(name, password)
        if user is not None and user.disabled:
            raise AccountDisabled(user.name)
        return user

    async def start_session(self, user: User) -> str:
        """A new browser session for `user`; the cookie token."""
        token, _ = await self.store.sessions.create(user.id, self.settings.session_ttl_s)
        return token

    async def take_password_reset(self, user: User) -> float | None:
        """When an admin last set `user`'s password, the first time they are told of it."""
        return await self.store.users.take_password_reset(user.id)

    async def end_session(self, token: str) -> None:
        await self.store.sessions.delete(token)

    async def usage(self, since: str | None, name: str | None) -> dict[str, Any]:
        """Requests and tokens per user, model, day and arm (never content)."""
        return await usage_report(self.store, since, name)

    async def ensure_admin(self) -> None:
        await ensure_admin(self.store, self.settings)

    # -- the audit log of admin actions ----------------------------------------------------

    async def record(
        self, actor: Actor | User | str, action: str, target: User | None = None, **detail: Any
    ) -> AuditEntry:
        """Append to the audit log: `actor` did `action` on `target` (detail: no content)."""
        return await self.audit.record(actor, action, target, **detail)

    async def audit_log(
        self, limit: int = 50, *, target: User | None = None, action: str | None = None
    ) -> list[AuditEntry]:
        """The newest audit entries first."""
        return await self.audit.entries(limit, target=target, action=action)

    def admin(self, actor: Actor | User | str) -> UserAdmin:
        """Account changes made by `actor`, each recorded in the audit log."""
        return UserAdmin(self.store, actor)


def write_private_file(path: Path, text: str) -> None:
    """Write `text` to a file only this user can read (0600), even if it existed before."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)


async def ensure_admin(store: Store, settings: Settings) -> None:
    """First start with no accounts: create the admin (taking over the local user's data).

    The password comes from settings.admin_password, or is generated: shown once on the
    terminal when stderr is one, otherwise (a service, a container, a pipe) written to
    `<data_dir>/admin-password.txt` (0600) and only that file's path is logged.
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
        await store.users.create(settings.admin_name, role="admin", tier="paid", password=password)
    admin = await store.users.get_by_name(settings.admin_name)
    await AuditLog(store).record(
        SYSTEM,
        "user.add",
        admin,
        role="admin",
        tier="paid",
        first_start=True,
        generated=not settings.admin_password,
    )
    login = f"http://{settings.host}:{settings.port}/login"
    change = f"change it with `chatbox users reset-password {settings.admin_name}`"
    if settings.admin_password:
        notice(
            log,
            f"chatbox: created the admin account {settings.admin_name!r} with the given password",
        )
    elif sys.stderr.isatty():
        print(
            f"chatbox: created the admin account {settings.admin_name!r}; log in at "
            f"{login} with password: {password}\n  (shown once; {change})",
            file=sys.stderr,
            flush=True,
        )
    else:  # not a terminal: the stream may be a log kept by others; never put it there
        path = settings.data_dir / ADMIN_PASSWORD_FILE
        write_private_file(path, password + "\n")
        notice(
            log,
            f"chatbox: created the admin account {settings.admin_name!r}; its generated "
            f"password is in {path} (mode 0600); log in at {login}, then delete the file "
            f"({change})",
        )
