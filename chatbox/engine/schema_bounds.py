"""Bounding a JSON schema before it becomes a grammar.

llama-cpp-python's converter writes `minItems: n` as n copies of a rule and `maxItems: n`
as n nested optional groups (string lengths are written as llama.cpp's own `char{m,n}`,
chatbox/engine/tools.py); llama.cpp then parses that text and, while sampling, tracks one
stack per open alternative (compared pairwise when stacks merge). So the grammar's size, its
compile time and memory, and each decode step's cost grow with a schema's numbers, not with
its size in bytes. `bound_schema` walks a schema first, refuses one whose numbers exceed
what an answer of `max_tokens` could hold or what a grammar may cost (`SchemaTooLarge`,
naming the keyword and its path), and drops upper bounds too large to spell out: the token
budget bounds the answer anyway. The shortest answer is counted through `$ref`s (a reference
chain costs what its target does), `allOf` (every part must hold) and `pattern` (its
shortest match); a reference that comes back to itself before the answer writes a character
is refused (the grammar would be left-recursive).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from chatbox.engine.pattern_span import pattern_span

# An upper bound on the characters one token writes, for "could max_tokens ever hold it":
# vocabularies hold runs of spaces or '=' this long, rarely longer.
CHARS_PER_TOKEN = 32
# llama.cpp refuses repetition counts above this in a grammar it is handed as `x{m,n}`.
MAX_REPEAT = 2000
# maxItems with more optional repetitions than this become unbounded (`x*`): each one is a
# nested group, and one step's stack is as deep as the groups it is in.
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


class Refs(Protocol):
    """What counting a schema needs of its references."""

    def shortest(self, ref: str) -> float:
        """The shortest answer the reference's target accepts."""
        ...

    def target(self, ref: str) -> Any:
        """The schema the reference points at (None: nothing)."""
        ...


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
        self.ref_chars: dict[str, float] = {}  # each reference's shortest answer, once known

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
        try:
            shortest = min_chars(out, self)
        except RecursionError:  # a reference's target not walked yet nests past any limit
            raise SchemaTooLarge(
                "$ref", path, f"schemas nest more than {MAX_DEPTH} levels deep"
            ) from None
        self.fits(shortest, _blame(out), path)
        return out

    # -- references -----------------------------------------------------------------------
    def target(self, ref: str) -> Any:
        return resolve_ref(self.root, ref)

    def shortest(self, ref: str) -> float:
        """The shortest answer a reference's target accepts (infinite where every answer
        would go through the reference again: no finite JSON matches it)."""
        if ref not in self.ref_chars:
            self._solve_refs(ref)
        return self.ref_chars.get(ref, 0.0)

    def _solve_refs(self, start: str) -> None:
        """Shortest answers of `start` and every reference it reaches, together: from
        "infinite", each round recounts them all until none changes (one more of them is
        final each round, so a round per reference suffices)."""
        targets: dict[str, Any] = {}
        todo = [start]
        while todo:
            ref = todo.pop()
            if ref in targets or ref in self.ref_chars:
                continue
            target = resolve_ref(self.root, ref)
            targets[ref] = target
            todo.extend(_refs_in(target))
        if not targets:
            return
        table = _Table(self, dict.fromkeys(targets, math.inf))
        for _ in range(len(targets) + 1):
            changed = False
            for ref, target in targets.items():
                chars = min_chars(target, table) if target is not None else 0.0
                if chars < table.chars[ref]:
                    table.chars[ref], changed = chars, True
            if not changed:
                break
        self.ref_chars.update(table.chars)

    def _left_recursion(self, ref: str, path: str) -> None:
        """SchemaTooLarge where `ref` leads back to itself through references and
        alternatives only, before any character is written: such a grammar never ends."""
        seen: set[str] = set()
        todo = [ref]
        while todo:
            at = todo.pop()
            if at in seen:
                continue
            seen.add(at)
            for head in _head_refs(resolve_ref(self.root, at)):
                if head == ref:
                    raise SchemaTooLarge(
                        "$ref",
                        path,
                        f"{ref} refers back to itself before the answer writes a character"
                        " (left recursion); put the recursion inside an object or array",
                    )
                todo.append(head)

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
        try:
            _follow(self.root, ref)
        except _BadRef as exc:
            raise SchemaTooLarge("$ref", path, str(exc)) from None
        self._left_recursion(ref, path)

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
        span = pattern_span(pattern)
        if span.longest > MAX_EXPANSION:  # repeats inside repeats multiply
            raise SchemaTooLarge(
                "pattern",
                path,
                f"its repeats multiply to {_figure(span.longest)} characters; at most"
                f" {MAX_EXPANSION:,} (write a shorter repeat, or * or + for no bound)",
            )
        self.spend("expansion", int(span.longest), "pattern", path)

    def _repetitions(
        self, schema: dict[str, Any], out: dict[str, Any], counts: dict[str, int], path: str
    ) -> None:
        """Lower bounds are spelled out; upper bounds kept while cheap, else dropped."""
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
            # a string's `char{m,n}` is a tail-recursive rule in llama.cpp: no deeper stacks
            optional = MAX_REPEAT if hi_key == "maxLength" else MAX_OPTIONAL
            if hi - lo > optional or hi > self.budget.max_chars or spent > MAX_EXPANSION:
                del out[hi_key]  # unbounded: the token budget ends the answer
            else:
                self.spend("expansion", max(0, hi - lo), hi_key, path)
        lo = counts.get("minProperties", 0)
        if lo > MAX_PROPERTIES:
            self.fits(min_chars(out), "minProperties", path)
            raise SchemaTooLarge(
                "minProperties", path, f"is {lo:,}; at most {MAX_PROPERTIES:,} properties"
            )


@dataclass
class _Table:
    """References' shortest answers while they are being counted (`chars`), over the ones
    already known."""

    walker: _Walker
    chars: dict[str, float]

    def shortest(self, ref: str) -> float:
        if ref in self.walker.ref_chars:
            return self.walker.ref_chars[ref]
        return self.chars.get(ref, 0.0)

    def target(self, ref: str) -> Any:
        return self.walker.target(ref)


def min_chars(schema: Any, refs: Refs | None = None) -> float:
    """A lower bound on the characters of any JSON value the converted grammar accepts,
    read the way the converter reads the schema; `refs` counts references (without it
    they count as nothing)."""

    def of(sub: Any) -> float:
        return min_chars(sub, refs)

    if not isinstance(schema, dict):
        return 0
    if "$ref" in schema:
        ref = schema["$ref"]
        return refs.shortest(ref) if refs is not None and isinstance(ref, str) else 0
    if "anyOf" in schema or "oneOf" in schema:
        alts = schema.get("oneOf") or schema.get("anyOf") or []
        if not isinstance(alts, list):
            return 0
        return min((of(a) for a in alts if isinstance(a, dict)), default=0)
    if "const" in schema:
        return _literal_chars(schema["const"])
    if "enum" in schema and isinstance(schema["enum"], list):
        return min((_literal_chars(v) for v in schema["enum"]), default=0)
    kind = schema.get("type")
    if isinstance(kind, list):
        return 1
    if kind in (None, "object") and isinstance(schema.get("properties"), dict):
        required: list[Any] = schema.get("required") or []
        if not isinstance(required, list):
            required = []
        total = _required_chars(schema["properties"], required, of)
        n = _safe_count(schema.get("minProperties"))
        return max(total, 2 + 6 * n)
    if kind in (None, "object") and isinstance(schema.get("allOf"), list):
        return _all_of_chars(schema["allOf"], refs)
    if kind in (None, "array") and isinstance(schema.get("items"), dict):
        n = _safe_count(schema.get("minItems"))
        return 2 + n * (of(schema["items"]) + 1) if n else 2  # no item: whatever they need
    items = schema.get("items") or schema.get("prefixItems")
    if kind in (None, "array") and isinstance(items, list):
        return 2 + sum(of(i) + 1 for i in items)
    if kind in (None, "string") and isinstance(schema.get("pattern"), str):
        return 2 + pattern_span(schema["pattern"]).shortest  # the converter's minLength too
    if kind == "string":
        return 2 + _safe_count(schema.get("minLength"))
    if kind == "object":
        return 2 + 6 * _safe_count(schema.get("minProperties"))
    return 1


def _required_chars(props: Any, required: Any, of: Callable[[Any], float]) -> float:
    """An object holding its required properties, at the least."""
    if not isinstance(props, dict):
        return 2.0
    names = {r for r in required if isinstance(r, str) and r in props}
    return 2.0 + sum(len(json.dumps(name)) + 2 + of(props[name]) for name in names)


def _all_of_chars(parts: list[Any], refs: Refs | None) -> float:
    """The converter merges allOf's parts (one reference deep) into one object: the
    properties of every part, required unless the part is an anyOf."""
    props: dict[str, Any] = {}
    required: set[str] = set()
    for part in parts:
        options = part.get("anyOf") if isinstance(part, dict) else None
        for comp in options if isinstance(options, list) else [part]:
            if not isinstance(comp, dict):
                continue
            if isinstance(comp.get("$ref"), str):
                comp = refs.target(comp["$ref"]) if refs is not None else None
            sub = comp.get("properties") if isinstance(comp, dict) else None
            if isinstance(sub, dict):
                props.update(sub)
                if options is None:
                    required.update(name for name in sub if isinstance(name, str))
    return _required_chars(props, list(required), lambda s: min_chars(s, refs))


def _blame(schema: dict[str, Any]) -> str:
    """The keyword to name when this node alone is too long for the budget."""
    if "$ref" in schema:
        return "$ref"  # the converter reads nothing else beside it
    for key in ("minItems", "minLength", "minProperties", "required", "prefixItems", "pattern"):
        if key in schema:
            return key
    return "allOf" if "allOf" in schema else "type"


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


class _BadRef(ValueError):
    """A reference that does not point at a schema this walk bounds."""


def _follow(root: Any, ref: str) -> Any:
    """The schema `ref` points at, or _BadRef saying why not."""
    if not ref.startswith("#/") and ref != "#":
        raise _BadRef("only local references (#/...) are supported")
    parts = [p.replace("~1", "/").replace("~0", "~") for p in ref[2:].split("/") if p]
    target: Any = root
    i = 0
    while i < len(parts):
        key = parts[i]
        if not isinstance(target, dict) or key not in target:
            raise _BadRef(f"{ref} points at nothing")
        if key in _SCHEMA_ONES and isinstance(target[key], dict):
            target, i = target[key], i + 1
            continue
        if i + 1 >= len(parts) or key not in (*_SCHEMA_MAPS, *_SCHEMA_LISTS, *_SCHEMA_ONES):
            raise _BadRef(
                f"{ref} must point at a schema under $defs, definitions,"
                " properties, items or a list of schemas"
            )
        sub, name = target[key], parts[i + 1]
        if isinstance(sub, list) and name.isdigit() and int(name) < len(sub):
            target = sub[int(name)]
        elif isinstance(sub, dict) and name in sub:
            target = sub[name]
        else:
            raise _BadRef(f"{ref} points at nothing")
        i += 2
    return target


def resolve_ref(root: Any, ref: str) -> Any:
    """The schema `ref` points at; None where it points at nothing usable."""
    try:
        return _follow(root, ref)
    except _BadRef:
        return None


def _refs_in(schema: Any) -> list[str]:
    """Every reference inside `schema` (walked without recursion: any depth)."""
    out: list[str] = []
    todo = [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                out.append(node["$ref"])
            for key in (*_SCHEMA_MAPS, *_SCHEMA_LISTS, *_SCHEMA_ONES):
                sub = node.get(key)
                if isinstance(sub, dict) and key in _SCHEMA_MAPS:
                    todo.extend(sub.values())
                elif isinstance(sub, (dict, list)):
                    todo.append(sub)
        elif isinstance(node, list):
            todo.extend(node)
    return out


def _head_refs(schema: Any) -> list[str]:
    """The references the converted rule starts with: the schema's own, or its
    alternatives' (anyOf, oneOf, nested), before any character of their own."""
    out: list[str] = []
    todo = [schema]
    while todo:
        node = todo.pop()
        if not isinstance(node, dict):
            continue
        if isinstance(node.get("$ref"), str):
            out.append(node["$ref"])
        elif "oneOf" in node or "anyOf" in node:
            alts = node.get("oneOf") or node.get("anyOf")
            if isinstance(alts, list):
                todo.extend(alts)
    return out
