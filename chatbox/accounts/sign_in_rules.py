"""Who may sign in through the identity provider or the auth proxy, and as what: the policy
file's `[sign_in]` rules, read at each sign-in so an edit applies at people's next one.

    [[sign_in.rule]]          # tried in order; the first that matches decides
    group = "chatbox-admins"  # or email_domain = "example.com" (a verified email only)
    role = "admin"            # admin or member (default member)
    tier = "paid"             # one of the policy's [tiers] (default free)

    [sign_in.default]         # anyone else the provider signs in; without it, refused
    tier = "free"
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import chatbox

ROLES = ("admin", "member")
RULE_KEYS = frozenset({"group", "email_domain", "role", "tier"})
DEFAULT_TIERS = ("free", "paid")  # the policy's when it names no [tiers]


class SignInRulesError(ValueError):
    """A `[sign_in]` table that cannot be used as written; the message says where."""


@dataclass(frozen=True)
class Rule:
    role: str
    tier: str
    group: str | None = None
    email_domain: str | None = None

    @property
    def label(self) -> str:
        """How the audit log names the rule that decided."""
        if self.group is not None:
            return f"group {self.group}"
        if self.email_domain is not None:
            return f"email domain {self.email_domain}"
        return "default"


@dataclass(frozen=True)
class Person:
    """What the provider or the proxy says of someone, as far as the rules read it."""

    groups: tuple[str, ...]
    email: str | None = None
    email_verified: bool = False


@dataclass(frozen=True)
class SignInRules:
    rules: tuple[Rule, ...] = ()
    default: Rule | None = None

    def decide(self, person: Person) -> Rule | None:
        """The first rule that matches, else the default; None: not allowed in."""
        domain = None
        if person.email and person.email_verified and "@" in person.email:
            domain = person.email.rsplit("@", 1)[1].lower()
        for rule in self.rules:
            if rule.group is not None and rule.group in person.groups:
                return rule
            if rule.email_domain is not None and rule.email_domain == domain:
                return rule
        return self.default

    @classmethod
    def load(cls, path: Path | None) -> SignInRules:
        """The rules of the policy file (default models/policy.toml); none without one."""
        path = path or Path(chatbox.__file__).resolve().parent.parent / "models" / "policy.toml"
        if not path.exists():
            return cls()
        try:
            raw = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise SignInRulesError(f"policy file {path}: not TOML: {exc}") from exc
        try:
            return cls.from_dict(raw)
        except SignInRulesError as exc:
            raise SignInRulesError(f"policy file {path}: {exc}") from exc

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SignInRules:
        body = raw.get("sign_in", {})
        if not isinstance(body, dict):
            raise SignInRulesError("[sign_in] must be a table")
        unknown = sorted(set(body) - {"rule", "default"})
        if unknown:
            raise SignInRulesError(f"[sign_in]: unknown keys {unknown}; known: default, rule")
        tiers_table = raw.get("tiers", {})
        tiers = tuple(tiers_table) if isinstance(tiers_table, dict) and tiers_table else ()
        tiers = tiers or DEFAULT_TIERS
        entries = body.get("rule", [])
        if not isinstance(entries, list):
            raise SignInRulesError("[[sign_in.rule]]: each rule is a [[sign_in.rule]] table")
        rules = tuple(
            _rule(f"[[sign_in.rule]] number {i}", e, tiers, matched=True)
            for i, e in enumerate(entries, 1)
        )
        default = body.get("default")
        return cls(
            rules, None if default is None else _rule("[sign_in.default]", default, tiers, False)
        )


def _rule(where: str, body: Any, tiers: tuple[str, ...], matched: bool) -> Rule:
    if not isinstance(body, dict):
        raise SignInRulesError(f"{where}: must be a table")
    allowed = RULE_KEYS if matched else RULE_KEYS - {"group", "email_domain"}
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise SignInRulesError(f"{where}: unknown keys {unknown}; known: {sorted(allowed)}")
    role = body.get("role", "member")
    tier = body.get("tier", "free")
    if role not in ROLES:
        raise SignInRulesError(f"{where}: role must be one of {', '.join(ROLES)}, not {role!r}")
    if tier not in tiers:
        raise SignInRulesError(
            f"{where}: tier {tier!r} is not a tier of this policy (tiers: {', '.join(tiers)})"
        )
    group, domain = body.get("group"), body.get("email_domain")
    if matched and (group is None) == (domain is None):
        raise SignInRulesError(f"{where}: give exactly one of group and email_domain")
    for key, value in (("group", group), ("email_domain", domain)):
        if value is not None and (not isinstance(value, str) or not value):
            raise SignInRulesError(f"{where}: {key} must be a name, not {value!r}")
    return Rule(role, tier, group, domain.lower() if isinstance(domain, str) else None)
