"""Signing in through the team's identity provider (OpenID Connect) or an auth proxy's
headers: accounts made on a person's first sign-in, role and tier from the policy's
`[sign_in]` rules at every sign-in, and each of these written to the audit log.

A person's provider identity (issuer, subject) names one account for good; an account is
never linked by email or name. When no rule lets a known person in any more, their account
is disabled (sessions end, keys stop) until a sign-in that a rule allows again.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
from dataclasses import dataclass

from chatbox.accounts.audit import SYSTEM, AuditLog
from chatbox.accounts.oidc import OidcClient, SignInFailed
from chatbox.accounts.sign_in_rules import Person, Rule, SignInRules
from chatbox.settings import Settings
from chatbox.store import Identity, SignInStart, Store, User
from chatbox.store.db import act_for
from chatbox.store.keys import hash_token

log = logging.getLogger("chatbox.accounts.sign_in")

PROXY = "proxy"  # the issuer of identities an auth proxy's headers name
START_TTL_S = 600.0  # a sign-in sent to the provider must come back within this
PROXY_RECHECK_S = 300.0  # a proxy user's rules are applied again at least this often
MAX_NAME = 64


class SignInExpired(Exception):
    """The callback's `state` is unknown, used, expired or from another browser."""


class NotAllowed(Exception):
    """The provider vouched for the person, but no sign-in rule lets them in."""


class DisabledByAdmin(Exception):
    """The person's account was disabled by an admin (not by the rules)."""


@dataclass(frozen=True)
class SignedIn:
    user: User
    session_token: str
    max_age_s: int  # the session's life: at most the ID token's
    next: str


class SignIns:
    """Sign-ins that are not a password: the provider's flow and the proxy's headers."""

    def __init__(self, store: Store, settings: Settings, audit: AuditLog) -> None:
        self.store = store
        self.settings = settings
        self.audit = audit
        self.oidc = OidcClient(settings) if settings.oidc_issuer else None

    @property
    def provider_name(self) -> str | None:
        """The name on the "Sign in with" button; None when no provider is configured."""
        return self.settings.oidc_display_name

    def password_allowed(self, name: str) -> bool:
        """Whether `name` may log in with a password: everyone, or with password login off,
        only the break-glass admin."""
        return self.settings.password_login or name == self.settings.admin_name

    def rules(self) -> SignInRules:
        return SignInRules.load(self.settings.policy_path)

    # -- OpenID Connect ----------------------------------------------------------------------

    async def start(self, redirect_uri: str, next_path: str, browser: str) -> str:
        """A new sign-in for the browser holding `browser` (a random cookie): the URL to send
        it to. Its state, nonce and PKCE verifier are kept here, never in the browser."""
        assert self.oidc is not None
        auth = await self.oidc.authorize(redirect_uri)
        await self.store.identities.start(
            auth.state,
            SignInStart(
                hash_token(browser),
                auth.nonce,
                auth.code_verifier,
                redirect_uri,
                next_path,
                time.time() + START_TTL_S,
            ),
        )
        return auth.url

    async def finish(self, state: str, code: str, iss: str | None, browser: str) -> SignedIn:
        """The provider's callback: the state taken (once), the code exchanged, the ID token
        verified, the person admitted by the rules, and a session no longer than the token."""
        assert self.oidc is not None
        start = await self.store.identities.take(state)
        if start is None or not hmac.compare_digest(hash_token(browser), start.browser_hash):
            raise SignInExpired("this sign-in expired, was used already, or is another browser's")
        if iss is not None and iss != self.oidc.issuer:  # RFC 9207: a mix-up of providers
            raise SignInFailed("the answer came from another issuer")
        claims = await self.oidc.finish(code, start.code_verifier, start.nonce, start.redirect_uri)
        user = await self._admit(
            claims.issuer,
            claims.subject,
            Person(claims.groups, claims.email, claims.email_verified),
            full_name=claims.name,
            username=claims.username,
            via="oidc",
        )
        ttl = min(self.settings.session_ttl_s, claims.expires_at - time.time())
        token, _ = await self.store.sessions.create(user.id, max(ttl, 1.0))
        return SignedIn(user, token, max(int(ttl), 1), start.next)

    # -- the auth proxy's headers ------------------------------------------------------------

    async def proxy_user(
        self, subject: str, groups: tuple[str, ...], email: str | None
    ) -> Identity:
        """The account the proxy's headers name, admitted by the rules when first seen, when
        its groups or email change, and every few minutes (the caller checked the proxy)."""
        known = await self.store.identities.find(PROXY, subject)
        if (
            known is not None
            and known.groups == groups
            and known.email == email
            and not known.user.disabled
            and time.time() - known.last_sign_in_at < PROXY_RECHECK_S
        ):
            act_for(known.user.id)
            return known
        person = Person(groups, email, email is not None)
        await self._admit(PROXY, subject, person, via="proxy", username=subject)
        identity = await self.store.identities.find(PROXY, subject)
        assert identity is not None
        act_for(identity.user.id)
        return identity

    # -- both --------------------------------------------------------------------------------

    async def _admit(
        self,
        issuer: str,
        subject: str,
        person: Person,
        *,
        via: str,
        full_name: str | None = None,
        username: str | None = None,
    ) -> User:
        """The person's account, made or brought in line with the rule that lets them in."""
        rule = self.rules().decide(person)
        known = await self.store.identities.find(issuer, subject)
        if rule is None:
            await self._refuse(issuer, subject, person, known, via)
            raise NotAllowed(
                "no sign-in rule lets this account in (its groups: "
                f"{', '.join(person.groups) or 'none'})"
            )
        if known is None:
            user = await self._provision(person, rule, via, full_name, username, subject)
            csrf = secrets.token_urlsafe(24)
            changed = True
        else:
            user, changed = await self._align(known, rule, via)
            csrf = known.csrf_token
            changed = changed or known.groups != person.groups or known.email != person.email
        await self.store.identities.save(
            issuer,
            subject,
            user.id,
            email=person.email,
            full_name=full_name or (known.full_name if known else None),
            groups=person.groups,
            csrf_token=csrf,
            provider_disabled=False,
        )
        if via == "oidc" or changed:  # a proxy's re-check of an unchanged person is quiet
            await self.audit.record(
                user, "user.sign_in", user, via=via, rule=rule.label, groups=list(person.groups)
            )
        fresh = await self.store.users.get(user.id)
        assert fresh is not None
        return fresh

    async def _provision(
        self,
        person: Person,
        rule: Rule,
        via: str,
        full_name: str | None,
        username: str | None,
        subject: str,
    ) -> User:
        """A new account on a first sign-in (no password: it signs in as it came)."""
        wanted = username or person.email or full_name or f"user-{subject[:12]}"
        name = await self._free_name(wanted)
        user = await self.store.users.create(name, role=rule.role, tier=rule.tier)
        await self.audit.record(
            SYSTEM, "user.add", user, role=rule.role, tier=rule.tier, via=via, rule=rule.label
        )
        return user

    async def _align(self, known: Identity, rule: Rule, via: str) -> tuple[User, bool]:
        """Role, tier and enabled as the rule says; each change audited."""
        user = known.user
        if user.disabled and not known.provider_disabled:
            raise DisabledByAdmin(user.name)
        changed = False
        if user.disabled:
            await self.store.users.set_disabled(user.id, False)
            await self.audit.record(
                SYSTEM, "user.enable", user, via=via, rule=rule.label, reason="a rule allows"
            )
            changed = True
        if user.role != rule.role:
            await self.store.users.set_role(user.id, rule.role)
            await self.audit.record(
                SYSTEM,
                "user.set_role",
                user,
                before=user.role,
                after=rule.role,
                via=via,
                rule=rule.label,
            )
            changed = True
        if user.tier != rule.tier:
            await self.store.users.set_tier(user.id, rule.tier)
            await self.audit.record(
                SYSTEM,
                "user.set_tier",
                user,
                before=user.tier,
                after=rule.tier,
                via=via,
                rule=rule.label,
            )
            changed = True
        return user, changed

    async def _refuse(
        self, issuer: str, subject: str, person: Person, known: Identity | None, via: str
    ) -> None:
        """No rule matches: a known account is disabled (its sessions end, its keys stop)."""
        groups = list(person.groups)
        if known is not None:
            user = known.user
            if not user.disabled:
                await self.store.users.set_disabled(user.id, True)
                await self.audit.record(
                    SYSTEM,
                    "user.disable",
                    user,
                    via=via,
                    reason="no sign-in rule matches",
                    groups=groups,
                )
            await self.store.identities.save(
                issuer,
                subject,
                user.id,
                email=person.email,
                full_name=known.full_name,
                groups=person.groups,
                csrf_token=known.csrf_token,
                provider_disabled=known.provider_disabled or not user.disabled,
            )
        await self.audit.record(
            SYSTEM,
            "user.sign_in_refused",
            known.user if known else None,
            via=via,
            issuer=issuer,
            groups=groups,
        )
        log.warning("sign-in refused (%s): no rule matches groups %s", via, groups)

    async def _free_name(self, wanted: str) -> str:
        base = " ".join(wanted.split())[: MAX_NAME - 4] or "user"
        name, n = base, 1
        while await self.store.users.get_by_name(name) is not None:
            n += 1
            name = f"{base}-{n}"
        return name

    async def methods(self) -> dict[str, str]:
        """How each account linked to a provider signs in: "provider" or "proxy" (the
        others use a password)."""
        by_user = await self.store.identities.issuers_by_user()
        return {uid: "proxy" if iss == PROXY else "provider" for uid, iss in by_user.items()}
