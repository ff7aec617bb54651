"""The policy: per-tier limits, routing rules and the overload order (a TOML file)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import chatbox

OVERLOAD_MODES = ("shed", "degrade", "queue")


def default_policy_path() -> Path:
    """models/policy.toml in the source tree (beside the chatbox package)."""
    return Path(chatbox.__file__).resolve().parent.parent / "models" / "policy.toml"


@dataclass(frozen=True)
class TierPolicy:
    name: str
    rpm: int = 60  # requests per minute (0: unlimited)
    tpm: int = 100_000  # prompt + completion tokens per minute (0: unlimited)
    daily_tokens: int = 0  # 0: no daily budget
    monthly_tokens: int = 0  # 0: no monthly budget
    max_streams: int = 4  # answers generating at once, per user
    model: str | None = None  # the tier's default model
    models: tuple[str, ...] = ()  # models the tier may pick; empty: any
    fallback: str | None = None  # the smaller model to degrade to under overload
    overload: str = "queue"  # shed | degrade | queue
    priority: int = 0  # in the engine's queue: lower goes first (0-9)
    retention_days: int = 0  # conversations idle this long are erased; 0: kept until deleted
    zero_retention: bool = False  # store no content at all: answers stream, usage is counted
    sharing: bool = True  # may share conversations by link (chatbox/chat/shares.py)
    tool_calls: int = 0  # tool calls in one answer (0: no tools offered)
    tool_seconds: float = 60.0  # wall seconds of one answer's tool calls together
    code_interpreter: bool = False  # the assistant may run Python in the sandbox


@dataclass(frozen=True)
class Canary:
    tier: str
    model: str
    percent: float
    arm: str
    judge: str | None = None  # the model grading sampled live answers (eval score)
    eval_percent: float = 0.0  # share of the tier's answers graded (opt-in; 0: none)
    auto_rollback: bool = True  # a guard metric worse with confidence rolls it back
    # An eval suite file: a sampled live answer to one of its prompts is scored by that case's
    # check (its reference) rather than by the judge alone; relative to the policy file.
    eval_suite: str | None = None


@dataclass(frozen=True)
class RoutingPolicy:
    small: str | None = None
    large: str | None = None
    auto_long_chars: int = 1200
    auto_code_markers: tuple[str, ...] = ("```", "def ", "class ", "function ", "#include")
    pins: dict[str, str] = field(default_factory=dict)  # user name -> model
    canaries: tuple[Canary, ...] = ()


@dataclass(frozen=True)
class OverloadPolicy:
    high_water: int = 0  # requests in an engine at which "shed" tiers get 503; 0: its slots
    degrade_factor: float = 2.0  # "degrade" tiers fall back past high_water x this
    retry_after_s: int = 5


CACHE_CHARGES = ("full", "requests")


@dataclass(frozen=True)
class AnswerCachePolicy:
    """The exact-match cache of deterministic OpenAI-API answers (chatbox/chat/answer_cache.py)."""

    enabled: bool = True
    max_bytes: int = 64 * 1024 * 1024  # the answers kept in RAM, least recently used out first
    ttl_s: int = 3600  # an answer older than this is answered afresh
    charge: str = "full"  # full: a hit costs the tokens the first answer used; requests: none
    public_tiers: tuple[str, ...] = ()  # tiers whose users share one another's answers


@dataclass(frozen=True)
class SemanticCachePolicy:
    """The semantic cache of first questions' answers (chatbox/chat/semantic_cache.py)."""

    tiers: tuple[str, ...] = ()  # the tiers whose users' first questions use it; none: off
    # The cosine similarity a kept question must reach (benchmarks/semantic_cache.py).
    threshold: float = 0.90
    max_entries: int = 10_000  # answers kept in RAM, least recently used out first
    ttl_s: int = 3600  # an answer older than this is answered afresh
    public_tiers: tuple[str, ...] = ()  # tiers whose users share one another's answers


@dataclass(frozen=True)
class Policy:
    tiers: dict[str, TierPolicy]
    routing: RoutingPolicy = field(default_factory=RoutingPolicy)
    overload: OverloadPolicy = field(default_factory=OverloadPolicy)
    answer_cache: AnswerCachePolicy = field(default_factory=AnswerCachePolicy)
    semantic_cache: SemanticCachePolicy = field(default_factory=SemanticCachePolicy)

    def tier(self, name: str) -> TierPolicy:
        """The tier's policy; an undefined tier gets the free tier's (or built-in) limits."""
        return self.tiers.get(name) or self.tiers.get("free") or TierPolicy(name)

    @classmethod
    def load(cls, path: Path | None = None) -> Policy:
        """Read the policy file (default: models/policy.toml); a missing file gives defaults."""
        path = path or default_policy_path()
        raw = tomllib.loads(path.read_text()) if path.exists() else {}
        for c in raw.get("routing", {}).get("canary", []):
            if isinstance(c, dict) and isinstance(c.get("eval_suite"), str):
                c["eval_suite"] = str(path.parent / c["eval_suite"])  # an absolute one stays
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Policy:
        tiers = {name: _tier(name, body) for name, body in raw.get("tiers", {}).items()}
        if not tiers:
            tiers = {"free": TierPolicy("free", overload="shed"), "paid": TierPolicy("paid")}
        routing = dict(raw.get("routing", {}))
        canaries = tuple(
            Canary(
                c["tier"],
                c["model"],
                float(c.get("percent", 0)),
                c.get("arm", f"canary-{c['model']}"),
                c.get("judge"),
                float(c.get("eval_percent", 0)),
                bool(c.get("auto_rollback", True)),
                c.get("eval_suite"),
            )
            for c in routing.pop("canary", [])
        )
        pins = {str(k): str(v) for k, v in routing.pop("pins", {}).items()}
        known = {f.name for f in fields(RoutingPolicy)}
        extra: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in routing.items() if k in known
        }
        overload = {
            k: v
            for k, v in raw.get("overload", {}).items()
            if k in {f.name for f in fields(OverloadPolicy)}
        }
        return cls(
            tiers,
            RoutingPolicy(pins=pins, canaries=canaries, **extra),
            OverloadPolicy(**overload),
            _answer_cache(raw.get("answer_cache", {})),
            _semantic_cache(raw.get("semantic_cache", {})),
        )


def _answer_cache(body: dict[str, Any]) -> AnswerCachePolicy:
    known = {f.name for f in fields(AnswerCachePolicy)}
    unknown = set(body) - known
    if unknown:
        raise ValueError(f"answer_cache: unknown keys {sorted(unknown)}")
    values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in body.items()}
    cache = AnswerCachePolicy(**values)
    if cache.charge not in CACHE_CHARGES:
        raise ValueError(f"answer_cache: charge must be one of {CACHE_CHARGES}")
    if not isinstance(cache.max_bytes, int) or cache.max_bytes < 0:
        raise ValueError("answer_cache: max_bytes must be a whole number >= 0")
    return cache


def _semantic_cache(body: dict[str, Any]) -> SemanticCachePolicy:
    known = {f.name for f in fields(SemanticCachePolicy)}
    unknown = set(body) - known
    if unknown:
        raise ValueError(f"semantic_cache: unknown keys {sorted(unknown)}")
    values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in body.items()}
    cache = SemanticCachePolicy(**values)
    if not isinstance(cache.threshold, int | float) or not 0 < cache.threshold <= 1:
        raise ValueError("semantic_cache: threshold must be a number in (0, 1]")
    if not isinstance(cache.max_entries, int) or cache.max_entries < 0:
        raise ValueError("semantic_cache: max_entries must be a whole number >= 0")
    return cache


def _tier(name: str, body: dict[str, Any]) -> TierPolicy:
    known = {f.name for f in fields(TierPolicy)} - {"name"}
    unknown = set(body) - known
    if unknown:
        raise ValueError(f"tier {name!r}: unknown keys {sorted(unknown)}")
    values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in body.items()}
    tier = TierPolicy(name, **values)
    if not isinstance(tier.retention_days, int) or tier.retention_days < 0:
        raise ValueError(f"tier {name!r}: retention_days must be a whole number >= 0")
    if not isinstance(tier.tool_calls, int) or tier.tool_calls < 0:
        raise ValueError(f"tier {name!r}: tool_calls must be a whole number >= 0")
    if not isinstance(tier.tool_seconds, int | float) or tier.tool_seconds <= 0:
        raise ValueError(f"tier {name!r}: tool_seconds must be a number > 0")
    if tier.overload not in OVERLOAD_MODES:
        raise ValueError(f"tier {name!r}: overload must be one of {OVERLOAD_MODES}")
    return tier
