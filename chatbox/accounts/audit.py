"""The append-only audit log of admin actions, and the admin actions on accounts that write it.

An entry says who acted (an account, or the CLI and the OS user running it), what they did,
on whom, and when, with a small JSON detail. It never holds content (conversations, memory,
documents) or secrets (passwords, keys): `record` refuses detail fields named like them.
"""

from __future__ import annotations

import getpass
from dataclasses import dataclass
from typing import Any

from chatbox.store import ApiKey, AuditEntry, Store, User

# Detail fields that would carry content or a secret; an entry names what changed, not it.
FORBIDDEN_DETAIL = frozenset(
    {"password", "secret", "token", "key", "text", "content", "facts", "memory", "prompt"}
)


@dataclass(frozen=True)
class Actor:
    """Who performed an admin action: an account (id and name), or a named non-account."""

    id: str | None
    name: str

    @classmethod
    def of(cls, who: Actor | User | str) -> Actor:
        if isinstance(who, Actor):
            return who
        if isinstance(who, User):
            return cls(who.id, who.name)
        return cls(None, who)


SYSTEM = Actor(None, "chatbox")  # the appliance itself (e.g. seeding the first admin)


def cli_actor() -> Actor:
    """The CLI has no login: it acts as `cli:<the OS user running it>`."""
    try:
        who = getpass.getuser()
    except Exception:  # no USER/LOGNAME and no passwd entry (some containers)
        who = "unknown"
    return Actor(None, f"cli:{who}")


class AuditLog:
    """Append and read the audit log; there is no way to change or remove an entry."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def record(
        self, actor: Actor | User | str, action: str, target: User | None = None, **detail: Any
    ) -> AuditEntry:
        """Append one entry: `actor` did `action` on `target`, with a content-free detail."""
        bad = sorted(k for k in detail if k.lower() in FORBIDDEN_DETAIL)
        if bad:
            raise ValueError(f"audit detail must not hold content or secrets: {bad}")
        who = Actor.of(actor)
        return await self.store.audit.append(
            actor_id=who.id,
            actor_name=who.name,
            action=action,
            target_id=target.id if target else None,
            target_name=target.name if target else None,
            detail=detail,
        )

    async def entries(
        self,
        limit: int = 50,
        *,
        target: User | None = None,
        action: str | None = None,
        before_id: int | None = None,
    ) -> list[AuditEntry]:
        """The newest entries first."""
        return await self.store.audit.list(
            limit, target_id=target.id if target else None, action=action, before_id=before_id
        )


def entry_out(e: AuditEntry) -> dict[str, Any]:
    """An entry as JSON (for the CLI's --json and, later, the console)."""
    return {
        "id": e.id,
        "at": e.at,
        "actor": {"id": e.actor_id, "name": e.actor_name},
        "action": e.action,
        "target": (
            {"id": e.target_id, "name": e.target_name} if e.target_id or e.target_name else None
        ),
        "detail": e.detail,
    }


class UserAdmin:
    """Admin changes to accounts and keys; each one is recorded in the audit log."""

    def __init__(self, store: Store, actor: Actor | User | str) -> None:
        self.store = store
        self.actor = Actor.of(actor)
        self.audit = AuditLog(store)

    async def add_user(
        self, name: str, role: str = "member", tier: str = "free", password: str | None = None
    ) -> User:
        user = await self.store.users.create(name, role=role, tier=tier, password=password)
        await self.audit.record(
            self.actor, "user.add", user, role=role, tier=tier, with_password=password is not None
        )
        return user

    async def set_tier(self, user: User, tier: str) -> User | None:
        changed = await self.store.users.set_tier(user.id, tier)
        await self.audit.record(self.actor, "user.set_tier", user, before=user.tier, after=tier)
        return changed

    async def set_role(self, user: User, role: str) -> User | None:
        changed = await self.store.users.set_role(user.id, role)
        await self.audit.record(self.actor, "user.set_role", user, before=user.role, after=role)
        return changed

    async def set_disabled(self, user: User, disabled: bool) -> User | None:
        changed = await self.store.users.set_disabled(user.id, disabled)
        await self.audit.record(self.actor, "user.disable" if disabled else "user.enable", user)
        return changed

    async def reset_password(
        self, user: User, password: str, generated: bool = False
    ) -> User | None:
        """Set `user`'s password: their sessions end, and unless they set it themself they
        are told at their next login."""
        changed = await self.store.users.set_password(user.id, password)
        entry = await self.audit.record(
            self.actor, "user.reset_password", user, generated=generated, sessions_ended=True
        )
        if self.actor.id != user.id:
            await self.store.users.mark_password_reset(user.id, entry.at)
        return changed

    async def create_key(self, user: User, label: str | None = None) -> tuple[ApiKey, str]:
        """A new API key acting as `user`: the record and the secret (shown once, not logged)."""
        key, secret = await self.store.keys.create(user.id, label)
        await self.audit.record(self.actor, "key.create", user, key_id=key.id, label=label)
        return key, secret

    async def revoke_key(self, key_ref: str) -> ApiKey | None:
        """Revoke an active key by its id or its prefix; None when there is no such key."""
        key = next(
            (
                k
                for k in await self.store.keys.list()
                if k.revoked_at is None and key_ref in (k.id, k.prefix)
            ),
            None,
        )
        if key is None or not await self.store.keys.revoke(key.id):
            return None
        owner = await self.store.users.get(key.user_id)
        await self.audit.record(self.actor, "key.revoke", owner, key_id=key.id, label=key.name)
        return key
