"""Bounding a JSON schema before it becomes a grammar.

llama-cpp-python's converter writes `minLength: n` as n copies of a rule and `maxLength: n`
as n nested optional groups; llama.cpp then parses that text and, while sampling, tracks one
stack per open alternative (compared pairwise when stacks merge). So the grammar's size, its
compile time and memory, and each decode step's cost grow with a schema's numbers, not with
its size in bytes. `bound_schema` walks a schema first, refuses one whose numbers exceed
what an answer of `max_tokens` could hold or what a grammar may cost (`SchemaTooLarge`,
naming the keyword and its path), and drops upper bounds too large to spell out: the token
budget bounds the answer anyway.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

# An upper bound on the characters one token writes, for "could max_tokens ever hold it":
# vocabularies hold runs of spaces or '=' this long, rarely longer.
CHARS_PER_TOKEN = 32
# llama.cpp refuses repetition counts above this in a grammar it is handed as `x{m,n}`.
MAX_REPEAT = 2000
# Upper bounds with more optional repetitions than this become unbounded (`x*`): each one
# is a nested group, and one step's stack is as deep as the groups it is in.
MAX_OPTIONAL = 64
MAX_EXPANSION = 20_000  # repeated rule references in one grammar, all keywords together
MAX_DEPTH = 24  # nested schemas (properties, items, anyOf, ...)
MAX_ALTERNATIVES = 1000  # enum values, anyOf/oneOf branches and type lists, together
# One anyOf/oneOf's branches are all open at its start: each costs ~1 ms of a decode step
# on a 49k vocabulary (an enum is written as a trie, only its next characters open).
MAX_BRANCHES = 128
MAX_PROPERTIES = 1000  # object properties, all objects together
# The converter spells out every suffix of an object's optional properties: 100 take ~10 ms.
MAX_OPTIONAL_PROPERTIES = 100
MAX_LITERAL_CHARS = 120_000  # property names, enum values and consts, together
MAX_PATTERN_CHARS = 1000
MAX_GRAMMAR_CHARS = 512_000  # the grammar text llama.cpp is handed (~3 ms to compile)

_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
_QUANTIFIER = re.compile(r"\{\s*(\d*)\s*(?:,\s*(\d*)\s*)?\}")
# Where the converter finds subschemas: name -> schema maps, lists, and single ones.
_SCHEMA_MAPS = ("properties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONES = ("items", "additionalProperties")


class SchemaTooLarge(ValueError):
    """A schema refused for its size: `keyword` at `path` (dotted, from the schema's root)."""

    def __init__(self, keyword: str, path: str, reason: str) -> None:
        where = ".".join(p for p in (path, keyword) if p)
        super().__init__(f"{where}: {reason}" if where else reason)
        self.keyword = keyword
        self.path = path
        self.where = where  # the keyword's path, as a request parameter names it
        self.reason = reason


@dataclass
class SchemaBudget:
    """What the grammars of one request may still spend (shared by all its schemas)."""

    max_tokens: int
    expansion: int = 0
    alternatives: int = 0
    properties: int = 0
    literal_chars: int = 0

    @property
    def max_chars(self) -> int:
        return max(1, self.max_tokens) * CHARS_PER_TOKEN


def bound_schema(schema: Any, budget: SchemaBudget) -> dict[str, Any]:
    """A copy of `schema` fit to become a grammar, or SchemaTooLarge; spends from `budget`."""
    if not isinstance(schema, dict):
        raise SchemaTooLarge("type", "", "a schema must be a JSON object")
    walker = _Walker(schema, budget)
    out = walker.node(schema, "", 0)
    return out


class _Walker:
    def __init__(self, root: dict[str, Any], budget: SchemaBudget) -> None:
        self.root = root
        self.budget = budget
        self.refs_seen: set[str] = set()

    # -- spending -------------------------------------------------------------------------
    def spend(self, what: str, n: int, keyword: str, path: str) -> None:
        b = self.budget
        limits = {
            "expansion": (MAX_EXPANSION, "repeated elements"),
            "alternatives": (MAX_ALTERNATIVES, "alternatives (enum values, anyOf/oneOf branches)"),
            "properties": (MAX_PROPERTIES, "object properties"),
            "literal_chars": (MAX_LITERAL_CHARS, "characters of names, enum values and consts"),
        }
        limit, words = limits[what]
        total = getattr(b, what) + n
        setattr(b, what, total)
        if total > limit:
            raise SchemaTooLarge(
                keyword,
                path,
                f"the schemas of this request need over {limit:,} {words}; "
                f"at most {limit:,} are allowed",
            )

    def fits(self, chars: float, keyword: str, path: str) -> None:
        """An answer matching this part needs at least `chars` characters."""
        limit = self.budget.max_chars
        if chars > limit:
            raise SchemaTooLarge(
                keyword,
                path,
                f"an answer matching it needs at least {_figure(chars)} characters, more than"
                f" max_tokens ({self.budget.max_tokens:,} tokens) can ever hold",
            )

    # -- the walk -------------------------------------------------------------------------
    def node(self, schema: Any, path: str, depth: int) -> dict[str, Any]:
        """A bounded copy of one schema node (non-object nodes pass for the converter)."""
        if not isinstance(schema, dict):
            return schema  # type: ignore[no-any-return]
        if depth > MAX_DEPTH:
            raise SchemaTooLarge(
                "properties" if "properties" in schema else "type",
                path,
                f"schemas nest more than {MAX_DEPTH} levels deep",
            )
        out = dict(schema)
        counts = {k: _count(schema[k], k, path) for k in _COUNTS if k in schema}
        self._ref(schema, path)
        for key in _SCHEMA_MAPS:
            sub = schema.get(key)
            if isinstance(sub, dict):
                if key == "properties":
                    self._properties(schema, sub, path)
                for name in sub:
                    self.spend("literal_chars", len(str(name)), key, path)
                out[key] = {
                    name: self.node(value, _join(path, key, name), depth + 1)
                    for name, value in sub.items()
                }
        for key in _SCHEMA_LISTS:
            sub = schema.get(key)
            if isinstance(sub, list):
                if key in ("anyOf", "oneOf"):
                    if len(sub) > MAX_BRANCHES:
                        raise SchemaTooLarge(
                            key, path, f"has {len(sub):,} branches; at most {MAX_BRANCHES:,}"
                        )
                    self.spend("alternatives", len(sub), key, path)
                out[key] = [
                    self.node(value, _join(path, key, str(i)), depth + 1)
                    for i, value in enumerate(sub)
                ]
        for key in _SCHEMA_ONES:
            if isinstance(schema.get(key), dict):
                out[key] = self.node(schema[key], _join(path, key), depth + 1)
            elif isinstance(schema.get(key), list):  # tuple-style items
                out[key] = [
                    self.node(value, _join(path, key, str(i)), depth + 1)
                    for i, value in enumerate(schema[key])
                ]
        if isinstance(schema.get("type"), list):
            self.spend("alternatives", len(schema["type"]), "type", path)
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list):
                raise SchemaTooLarge("enum", path, "must be an array")
            self.spend("alternatives", len(values), "enum", path)
            self.spend("literal_chars", sum(_literal_chars(v) for v in values), "enum", path)
        if "const" in schema:
            self.spend("literal_chars", _literal_chars(schema["const"]), "const", path)
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            self._pattern(pattern, path)
        self._repetitions(schema, out, counts, path)
        self.fits(min_chars(out), _blame(out), path)
        return out

    def _properties(self, schema: dict[str, Any], props: dict[str, Any], path: str) -> None:
        self.spend("properties", len(props), "properties", path)
        required = schema.get("required")
        named = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
        optional = sum(1 for name in props if name not in named)
        if optional > MAX_OPTIONAL_PROPERTIES:
            raise SchemaTooLarge(
                "properties",
                path,
                f"has {optional:,} optional properties; at most {MAX_OPTIONAL_PROPERTIES:,}"
                " (list the others in required)",
            )

    def _ref(self, schema: dict[str, Any], path: str) -> None:
        """A reference must point at a schema this walk bounds (under $defs, properties...):
        the converter reads its target from the bounded copy."""
        ref = schema.get("$ref")
        if not isinstance(ref, str) or ref in self.refs_seen:
            return
        self.refs_seen.add(ref)
        if not ref.startswith("#/") and ref != "#":
            raise SchemaTooLarge("$ref", path, "only local references (#/...) are supported")
        parts = [p.replace("~1", "/").replace("~0", "~") for p in ref[2:].split("/") if p]
        target: Any = self.root
        i = 0
        while i < len(parts):
            key = parts[i]
            if not isinstance(target, dict) or key not in target:
                raise SchemaTooLarge("$ref", path, f"{ref} points at nothing")
            if key in _SCHEMA_ONES and isinstance(target[key], dict):
                target, i = target[key], i + 1
                continue
            if i + 1 >= len(parts) or key not in (*_SCHEMA_MAPS, *_SCHEMA_LISTS, *_SCHEMA_ONES):
                raise SchemaTooLarge(
                    "$ref",
                    path,
                    f"{ref} must point at a schema under $defs, definitions,"
                    " properties, items or a list of schemas",
                )
            sub, name = target[key], parts[i + 1]
            if isinstance(sub, list) and name.isdigit() and int(name) < len(sub):
                target = sub[int(name)]
            elif isinstance(sub, dict) and name in sub:
                target = sub[name]
            else:
                raise SchemaTooLarge("$ref", path, f"{ref} points at nothing")
            i += 2

    def _pattern(self, pattern: str, path: str) -> None:
        if len(pattern) > MAX_PATTERN_CHARS:
            raise SchemaTooLarge(
                "pattern", path, f"is {len(pattern):,} characters; at most {MAX_PATTERN_CHARS:,}"
            )
        for m in _QUANTIFIER.finditer(pattern):
            lo = int(m.group(1) or 0)
            hi = lo if m.group(2) is None and "," not in m.group(0) else int(m.group(2) or 0)
            for n in (lo, hi):
                if n > MAX_REPEAT:
                    raise SchemaTooLarge(
                        "pattern", path, f"repeats {m.group(0)}; at most {MAX_REPEAT:,} times"
                    )
            # a literal repeated is spelled out: its length times the count, at most
            self.spend("expansion", max(lo, hi) * max(1, len(pattern) // 8), "pattern", path)

    def _repetitions(
        self, schema: dict[str, Any], out: dict[str, Any], counts: dict[str, int], path: str
    ) -> None:
        """minX are spelled out as copies; maxX as nested optional groups, or dropped."""
        for lo_key, hi_key in (("minLength", "maxLength"), ("minItems", "maxItems")):
            lo = counts.get(lo_key, 0)
            if lo > MAX_REPEAT:
                self.fits(min_chars(out), lo_key, path)  # beyond max_tokens: say so
                raise SchemaTooLarge(
                    lo_key, path, f"is {lo:,}; a grammar spells out at most {MAX_REPEAT:,}"
                )
            self.spend("expansion", lo, lo_key, path)
            hi = counts.get(hi_key)
            if hi is None:
                continue
            spent = self.budget.expansion + max(0, hi - lo)
            if hi - lo > MAX_OPTIONAL or hi > self.budget.max_chars or spent > MAX_EXPANSION:
                del out[hi_key]  # unbounded: the token budget ends the answer
            else:
                self.spend("expansion", max(0, hi - lo), hi_key, path)
        lo = counts.get("minProperties", 0)
        if lo > MAX_PROPERTIES:
            self.fits(min_chars(out), "minProperties", path)
            raise SchemaTooLarge(
                "minProperties", path, f"is {lo:,}; at most {MAX_PROPERTIES:,} properties"
            )


def min_chars(schema: Any) -> float:
    """A lower bound on the characters of any JSON value the converted grammar accepts;
    references count as nothing (their targets are checked where they are)."""
    if not isinstance(schema, dict) or "$ref" in schema:
        return 0
    if "anyOf" in schema or "oneOf" in schema:
        alts = schema.get("oneOf") or schema.get("anyOf") or []
        return min((min_chars(a) for a in alts if isinstance(a, dict)), default=0)
    if "const" in schema:
        return _literal_chars(schema["const"])
    if "enum" in schema and isinstance(schema["enum"], list):
        return min((_literal_chars(v) for v in schema["enum"]), default=0)
    kind = schema.get("type")
    if kind in (None, "object") and isinstance(schema.get("properties"), dict):
        props: dict[str, Any] = schema["properties"]
        required: list[Any] = schema.get("required") or []
        if not isinstance(required, list):
            required = []
        total = 2.0
        for name in {r for r in required if isinstance(r, str) and r in props}:
            total += len(json.dumps(name)) + 2 + min_chars(props[name])
        n = _safe_count(schema.get("minProperties"))
        return max(total, 2 + 6 * n)
    if kind in (None, "array") and isinstance(schema.get("items"), dict):
        n = _safe_count(schema.get("minItems"))
        return 2 + n * (min_chars(schema["items"]) + 1)
    items = schema.get("items") or schema.get("prefixItems")
    if kind in (None, "array") and isinstance(items, list):
        return 2 + sum(min_chars(i) + 1 for i in items)
    if kind == "string":
        return 2 + _safe_count(schema.get("minLength"))
    if kind == "object":
        return 2 + 6 * _safe_count(schema.get("minProperties"))
    return 1


def _blame(schema: dict[str, Any]) -> str:
    """The keyword to name when this node alone is too long for the budget."""
    for key in ("minItems", "minLength", "minProperties", "required", "prefixItems"):
        if key in schema:
            return key
    return "type"


def _count(value: Any, keyword: str, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SchemaTooLarge(keyword, path, "must be a non-negative integer")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise SchemaTooLarge(keyword, path, "must be a non-negative integer")
    if value < 0:
        raise SchemaTooLarge(keyword, path, "must be a non-negative integer")
    return int(value)


def _safe_count(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _literal_chars(value: Any) -> int:
    try:
        return len(json.dumps(value))
    except (RecursionError, ValueError, TypeError):
        return MAX_LITERAL_CHARS + 1  # nested past what json can write: over any budget


def _figure(chars: float) -> str:
    return f"{chars:,.0f}" if math.isfinite(chars) else "infinitely many"


def _join(path: str, *parts: str) -> str:
    return ".".join(p for p in (path, *parts) if p)
