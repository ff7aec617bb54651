"""The moderation policy: per tier and category, what happens (block, warn, flag, allow), at
which score, plus the admin's own rules; the `[moderation]` section of models/policy.toml."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Action = Literal["allow", "warn", "flag", "block"]
Direction = Literal["input", "output", "document", "memory", "api"]
ACTIONS: tuple[Action, ...] = ("allow", "warn", "flag", "block")  # in order of severity
CATEGORIES = ("harassment", "hate", "self-harm", "sexual", "sexual/minors", "violence", "illicit")
PROFANITY = "profanity"  # the toxicity classifier's score
SCORED = (*CATEGORIES, PROFANITY)

DEFAULT_THRESHOLDS: dict[str, float] = {
    "harassment": 0.6,
    "hate": 0.6,
    "self-harm": 0.6,
    "sexual": 0.6,
    "sexual/minors": 0.6,
    "violence": 0.6,
    "illicit": 0.6,
    PROFANITY: 0.9,
}
DEFAULT_ACTIONS: dict[str, Action] = {
    "harassment": "flag",
    "hate": "block",
    "self-harm": "block",
    "sexual": "flag",
    "sexual/minors": "block",
    "violence": "block",
    "illicit": "block",
    PROFANITY: "warn",
}


def severity(action: Action) -> int:
    return ACTIONS.index(action)


def _action(value: Any, where: str) -> Action:
    if value not in ACTIONS:
        raise ValueError(f"{where}: action must be one of {ACTIONS}, not {value!r}")
    action: Action = value
    return action


def _scores(raw: dict[str, Any], where: str, kind: str) -> dict[str, Any]:
    unknown = set(raw) - set(SCORED)
    if unknown:
        raise ValueError(f"{where}: unknown categories {sorted(unknown)}; known: {SCORED}")
    if kind == "thresholds":
        for name, value in raw.items():
            if not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{where}: threshold of {name!r} must be within 0..1")
        return {k: float(v) for k, v in raw.items()}
    return {k: _action(v, f"{where}.{k}") for k, v in raw.items()}


@dataclass(frozen=True)
class Rule:
    """An admin rule: blocked terms (whole words, any case) and regular expressions."""

    name: str
    category: str
    action: Action
    terms: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    tiers: tuple[str, ...] = ()  # empty: every tier
    directions: tuple[str, ...] = ("input", "output", "document", "memory", "api")
    regex: re.Pattern[str] | None = None

    def applies(self, tier: str, direction: str) -> bool:
        return (not self.tiers or tier in self.tiers) and direction in self.directions

    def match(self, text: str) -> bool:
        return self.regex is not None and self.regex.search(text) is not None


def _rule(i: int, raw: dict[str, Any]) -> Rule:
    where = f"moderation.rules[{i}]"
    known = {"name", "category", "action", "terms", "patterns", "tiers", "directions"}
    if set(raw) - known:
        raise ValueError(f"{where}: unknown keys {sorted(set(raw) - known)}")
    terms = tuple(str(t) for t in raw.get("terms", []) if str(t).strip())
    patterns = tuple(str(p) for p in raw.get("patterns", []))
    parts = [r"(?<!\w)" + re.escape(t) + r"(?!\w)" for t in terms]
    for p in patterns:
        try:
            re.compile(p)
        except re.error as exc:
            raise ValueError(f"{where}: bad pattern {p!r}: {exc}") from exc
        parts.append(f"(?:{p})")
    regex = re.compile("|".join(parts), re.IGNORECASE) if parts else None
    return Rule(
        str(raw.get("name", f"rule-{i + 1}")),
        str(raw.get("category", "rule")),
        _action(raw.get("action", "block"), where),
        terms,
        patterns,
        tuple(raw.get("tiers", [])),
        tuple(raw.get("directions", Rule.directions)),
        regex,
    )


@dataclass(frozen=True)
class TierModeration:
    """What one tier's checks do: an action and a threshold per category."""

    actions: dict[str, Action]
    thresholds: dict[str, float]
    keep_text: bool  # False: zero-data-retention, the queue keeps categories and scores only


@dataclass(frozen=True)
class ModerationPolicy:
    enabled: bool = True
    output: bool = True  # check answers as they stream
    window_tokens: int = 64  # the rolling window over an answer (at most 64 tokens)
    stride_tokens: int = 32  # a new window every N tokens: windows overlap by the rest
    base: TierModeration = field(
        default_factory=lambda: TierModeration(
            dict(DEFAULT_ACTIONS), dict(DEFAULT_THRESHOLDS), True
        )
    )
    tiers: dict[str, TierModeration] = field(default_factory=dict)
    rules: tuple[Rule, ...] = ()

    def tier(self, name: str) -> TierModeration:
        return self.tiers.get(name, self.base)

    def lowest_threshold(self) -> float:
        """The lowest category threshold of any tier."""
        return min(
            t.thresholds.get(c, 1.0) for t in (self.base, *self.tiers.values()) for c in CATEGORIES
        )

    @classmethod
    def load(cls, path: Path | None) -> ModerationPolicy:
        """The `[moderation]` section of the policy file (defaults where it is absent)."""
        raw = tomllib.loads(path.read_text()) if path is not None and path.exists() else {}
        return cls.from_dict(raw.get("moderation", {}))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModerationPolicy:
        known = {"enabled", "output", "window_tokens", "stride_tokens", "keep_text"}
        known |= {"actions", "thresholds", "rules", "tiers"}
        if set(raw) - known:
            raise ValueError(f"moderation: unknown keys {sorted(set(raw) - known)}")
        window = int(raw.get("window_tokens", 64))
        stride = int(raw.get("stride_tokens", min(32, window)))
        if not 8 <= window <= 64 or not 1 <= stride <= window:
            raise ValueError("moderation: window_tokens must be 8..64, stride_tokens 1..window")
        base = TierModeration(
            {**DEFAULT_ACTIONS, **_scores(raw.get("actions", {}), "moderation.actions", "a")},
            {
                **DEFAULT_THRESHOLDS,
                **_scores(raw.get("thresholds", {}), "moderation.thresholds", "thresholds"),
            },
            bool(raw.get("keep_text", True)),
        )
        tiers = {}
        for name, body in raw.get("tiers", {}).items():
            where = f"moderation.tiers.{name}"
            if set(body) - {"actions", "thresholds", "keep_text"}:
                raise ValueError(f"{where}: unknown keys {sorted(body)}")
            tiers[name] = TierModeration(
                {**base.actions, **_scores(body.get("actions", {}), where, "a")},
                {**base.thresholds, **_scores(body.get("thresholds", {}), where, "thresholds")},
                bool(body.get("keep_text", base.keep_text)),
            )
        rules = tuple(_rule(i, r) for i, r in enumerate(raw.get("rules", [])))
        return cls(
            bool(raw.get("enabled", True)),
            bool(raw.get("output", True)),
            window,
            stride,
            base,
            tiers,
            rules,
        )
