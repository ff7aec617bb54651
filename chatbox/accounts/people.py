"""The console's view of people: users with their keys and usage, and the admin's changes
to them (each one recorded in the audit log by `UserAdmin`)."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

from chatbox.accounts.audit import UserAdmin
from chatbox.accounts.service import AccountsService
from chatbox.store import ApiKey, User
from chatbox.store.usage import day_of

ROLES = ("admin", "member")
MIN_PASSWORD = 8
MAX_NAME = 64


class PeopleError(ValueError):
    """An admin's change that cannot be made (a clear 4xx, nothing changed)."""


class NotForAdmins(PeopleError):
    """A change the admin role does not allow (403): it would open another person's content."""


@dataclass(frozen=True)
class Person:
    user: User
    keys: list[ApiKey]
    usage: dict[str, Any]  # {"days": [...], "requests": [...], "tokens": [...]}


class People:
    """Users as an admin manages them, through the accounts service."""

    def __init__(self, accounts: AccountsService, actor: User) -> None:
        self.accounts = accounts
        self.actor = actor
        self.admin: UserAdmin = accounts.admin(actor)

    async def list(self) -> list[User]:
        return await self.accounts.store.users.list()

    async def get(self, user_id: str) -> User:
        user = await self.accounts.user(user_id)
        if user is None:
            raise LookupError("no such user")
        return user

    async def person(self, user_id: str, days: int = 30) -> Person:
        user = await self.get(user_id)
        keys = await self.accounts.store.keys.list(user.id)
        return Person(user, keys, await self.usage_by_day(user, days))

    async def usage_by_day(self, user: User, days: int = 30) -> dict[str, Any]:
        """Requests and tokens per day over the last `days` days (zeros included)."""
        now = time.time()
        axis = [day_of(now - 86400 * back) for back in range(days - 1, -1, -1)]
        rows = await self.accounts.store.usage.report(axis[0], user.id)
        requests = dict.fromkeys(axis, 0)
        tokens = dict.fromkeys(axis, 0)
        for r in rows:
            if r.day in requests:
                requests[r.day] += r.requests
                tokens[r.day] += r.total_tokens
        return {"days": axis, "requests": list(requests.values()), "tokens": list(tokens.values())}

    # -- changes (audited) -----------------------------------------------------------------

    async def add(self, name: str, role: str, tier: str, password: str) -> User:
        name = name.strip()
        if not name or len(name) > MAX_NAME:
            raise PeopleError(f"a name needs 1 to {MAX_NAME} characters")
        _check(role, tier)
        if len(password) < MIN_PASSWORD:
            raise PeopleError(f"a password needs at least {MIN_PASSWORD} characters")
        if await self.accounts.store.users.get_by_name(name) is not None:
            raise PeopleError(f"a user named {name!r} already exists")
        return await self.admin.add_user(name, role=role, tier=tier, password=password)

    async def set_tier(self, user_id: str, tier: str) -> User:
        _check("member", tier)
        user = await self.get(user_id)
        return await self.admin.set_tier(user, tier) or user

    async def set_role(self, user_id: str, role: str) -> User:
        _check(role, "free")
        user = await self.get(user_id)
        if user.id == self.actor.id and role != "admin":
            raise PeopleError("you cannot take away your own admin role")
        return await self.admin.set_role(user, role) or user

    async def set_disabled(self, user_id: str, disabled: bool) -> User:
        user = await self.get(user_id)
        if disabled and user.id == self.actor.id:
            raise PeopleError("you cannot disable your own account")
        return await self.admin.set_disabled(user, disabled) or user

    async def reset_password(self, user_id: str, password: str | None) -> tuple[User, str]:
        """Set a password (generated when none is given); returns it to show once."""
        user = await self.get(user_id)
        generated = not password
        password = password or secrets.token_urlsafe(12)
        if len(password) < MIN_PASSWORD:
            raise PeopleError(f"a password needs at least {MIN_PASSWORD} characters")
        await self.admin.reset_password(user, password, generated=generated)
        return user, password

    async def create_key(self, user_id: str, label: str | None) -> tuple[ApiKey, str]:
        """A key for the admin themself: a key acts as its owner, so one made for another
        person would read their conversations (admins are not trusted with content)."""
        user = await self.get(user_id)
        if user.id != self.actor.id:
            raise NotForAdmins(
                f"an admin cannot create an API key for {user.name}: a key acts as its owner"
                " and would open their conversations"
            )
        return await self.admin.create_key(user, (label or "").strip()[:100] or None)

    async def revoke_key(self, user_id: str, key_id: str) -> ApiKey:
        keys = await self.accounts.store.keys.list(user_id)
        if not any(k.id == key_id and k.revoked_at is None for k in keys):
            raise LookupError("no such active key")
        key = await self.admin.revoke_key(key_id)
        if key is None:
            raise LookupError("no such active key")
        return key


def _check(role: str, tier: str) -> None:
    if role not in ROLES:
        raise PeopleError(f"role must be one of {', '.join(ROLES)}")
    tier = tier.strip()
    if not tier or len(tier) > 32 or not tier.replace("-", "").replace("_", "").isalnum():
        raise PeopleError("a tier is a short name of letters, digits, '-' or '_'")
