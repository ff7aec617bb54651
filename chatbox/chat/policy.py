"""The policy: per-tier limits, routing rules and the overload order (a TOML file)."""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
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
    sharing: bool = True  # may share conversations by link (chatbox/chat/teams/shares.py)
    tool_calls: int = 4  # tool calls in one answer (0: no tools; offered where turned on)
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
    """The exact-match cache of deterministic OpenAI-API answers
    (chatbox/chat/caches/answer_cache.py)."""

    enabled: bool = True
    max_bytes: int = 64 * 1024 * 1024  # the answers kept in RAM, least recently used out first
    ttl_s: int = 3600  # an answer older than this is answered afresh
    charge: str = "full"  # full: a hit costs the tokens the first answer used; requests: none
    public_tiers: tuple[str, ...] = ()  # tiers whose users share one another's answers


@dataclass(frozen=True)
class SemanticCachePolicy:
    """The semantic cache of first questions' answers (chatbox/chat/caches/semantic_cache.py)."""

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
        """Read the policy file (default: models/policy.toml); a missing file gives defaults.
        A bad file is a PolicyError naming the file, the entry and the problem."""
        path = path or default_policy_path()
        try:
            raw = tomllib.loads(path.read_text()) if path.exists() else {}
        except tomllib.TOMLDecodeError as exc:
            raise PolicyError(f"policy file {path}: not TOML: {exc}") from exc
        routing = raw.get("routing")
        entries = routing.get("canary") if isinstance(routing, dict) else None
        for c in entries if isinstance(entries, list) else []:
            if isinstance(c, dict) and isinstance(c.get("eval_suite"), str):
                c["eval_suite"] = str(path.parent / c["eval_suite"])  # an absolute one stays
        try:
            return cls.from_dict(raw)
        except (TypeError, ValueError) as exc:
            raise PolicyError(f"policy file {path}: {exc}") from exc

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Policy:
        _known_keys("the policy file", raw, TABLES)
        tiers = {name: _tier(name, body) for name, body in _table(raw, "tiers").items()}
        if not tiers:
            tiers = {"free": TierPolicy("free", overload="shed"), "paid": TierPolicy("paid")}
        routing = dict(_table(raw, "routing"))
        entries = routing.pop("canary", [])
        if not isinstance(entries, list):
            raise PolicyError("[[routing.canary]]: each canary is a [[routing.canary]] table")
        canaries = tuple(_canary(i, c, tiers) for i, c in enumerate(entries, 1))
        arms = [c.arm for c in canaries]
        if len(set(arms)) < len(arms):
            again = sorted({a for a in arms if arms.count(a) > 1})
            raise PolicyError(f"[[routing.canary]]: arm names must differ; repeated: {again}")
        pins = {str(k): str(v) for k, v in _table(routing, "pins", "routing.").items()}
        routing.pop("pins", None)
        known = {f.name for f in fields(RoutingPolicy)} - {"pins", "canaries"}
        _known_keys("[routing]", routing, known | {"pins", "canary"})
        extra: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in routing.items() if k in known
        }
        overload = _table(raw, "overload")
        _known_keys("[overload]", overload, {f.name for f in fields(OverloadPolicy)})
        return cls(
            tiers,
            RoutingPolicy(pins=pins, canaries=canaries, **extra),
            OverloadPolicy(**overload),
            _answer_cache(_table(raw, "answer_cache")),
            _semantic_cache(_table(raw, "semantic_cache")),
        )


class PolicyError(ValueError):
    """A policy file that cannot be served as written; the message says what and where."""


# The policy file's top-level tables; [moderation] and [sign_in] are read and checked by
# chatbox/moderation/policy.py and chatbox/accounts/sign_in_rules.py.
TABLES = (
    "tiers",
    "routing",
    "overload",
    "answer_cache",
    "semantic_cache",
    "moderation",
    "sign_in",
)


def _table(raw: dict[str, Any], name: str, prefix: str = "") -> dict[str, Any]:
    body = raw.get(name, {})
    if not isinstance(body, dict):
        raise PolicyError(f"[{prefix}{name}] must be a table, not {body!r}")
    return body


def _known_keys(where: str, body: dict[str, Any], known: Iterable[str]) -> None:
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise PolicyError(f"{where}: unknown keys {unknown}; known: {sorted(known)}")


def _canary(number: int, body: Any, tiers: dict[str, TierPolicy]) -> Canary:
    """One [[routing.canary]] entry, checked: its tier exists, its shares are percentages."""
    where = f"[[routing.canary]] number {number}"
    if not isinstance(body, dict):
        raise PolicyError(f"{where}: must be a table")
    if isinstance(body.get("arm"), str):
        where += f" (arm {body['arm']!r})"
    _known_keys(where, body, {f.name for f in fields(Canary)})
    for key in ("tier", "model"):
        if not isinstance(body.get(key), str) or not body[key]:
            raise PolicyError(f"{where}: {key} must be given, as a name")
    if body["tier"] not in tiers:
        raise PolicyError(
            f"{where}: tier {body['tier']!r} is not a tier of this policy "
            f"(tiers: {', '.join(sorted(tiers))})"
        )
    for key in ("percent", "eval_percent"):
        value = body.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 100:
            raise PolicyError(f"{where}: {key} must be a number from 0 to 100, not {value!r}")
    for key in ("arm", "judge", "eval_suite"):
        if key in body and (not isinstance(body[key], str) or not body[key]):
            raise PolicyError(f"{where}: {key} must be a name, not {body[key]!r}")
    if not isinstance(body.get("auto_rollback", True), bool):
        raise PolicyError(f"{where}: auto_rollback must be true or false")
    return Canary(
        body["tier"],
        body["model"],
        float(body.get("percent", 0)),
        body.get("arm", f"canary-{body['model']}"),
        body.get("judge"),
        float(body.get("eval_percent", 0)),
        body.get("auto_rollback", True),
        body.get("eval_suite"),
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
