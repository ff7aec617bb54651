"""How long a JSON schema's `pattern` can match: a conservative reading of the regular
expression, in the grammar converter's syntax, that `chatbox.engine.schema_bounds` counts
a string's shortest answer and its grammar's size by."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Span:
    """A pattern's match lengths: the shortest, and a conservative longest that counts
    each unbounded repeat (*, +, {m,}) as its minimum and one more."""

    shortest: float
    longest: float


@lru_cache(maxsize=256)
def pattern_span(pattern: str) -> Span:
    """A conservative reading of a pattern's match lengths, in the converter's syntax
    (one character for a class, a dot or an escape); a pattern it cannot read spans
    nothing (the converter refuses it later)."""
    body = pattern[1:] if pattern.startswith("^") else pattern
    body = body[:-1] if body.endswith("$") and not body.endswith("\\$") else body
    try:
        span, end = _alternatives(body, 0)
    except (IndexError, ValueError):
        return Span(0, 0)
    return span if end >= len(body) else Span(0, 0)


def _alternatives(text: str, i: int) -> tuple[Span, int]:
    """Branches separated by | up to a closing parenthesis (or the end)."""
    branches: list[Span] = []
    while True:
        span, i = _sequence(text, i)
        branches.append(span)
        if i < len(text) and text[i] == "|":
            i += 1
            continue
        break
    return Span(min(b.shortest for b in branches), max(b.longest for b in branches)), i


def _sequence(text: str, i: int) -> tuple[Span, int]:
    shortest = longest = 0.0
    while i < len(text) and text[i] not in "|)":
        atom, i = _atom(text, i)
        atom, i = _quantified(text, i, atom)
        shortest += atom.shortest
        longest += atom.longest
    return Span(shortest, longest), i


def _atom(text: str, i: int) -> tuple[Span, int]:
    c = text[i]
    if c == "(":
        inner, i = _alternatives(text, i + 1)
        if i >= len(text) or text[i] != ")":
            raise ValueError("unbalanced parentheses")
        return inner, i + 1
    if c == "[":
        i += 1
        while text[i] != "]":
            i += 2 if text[i] == "\\" else 1
        return Span(1, 1), i + 1
    if c == "\\":
        return Span(1, 1), i + 2
    if c in "*+?{":
        raise ValueError("a repeat of nothing")
    return Span(1, 1), i + 1


def _quantified(text: str, i: int, atom: Span) -> tuple[Span, int]:
    """The atom under the repeats that follow it (each applies to what is before it)."""
    while i < len(text) and text[i] in "*+?{":
        c = text[i]
        if c == "{":
            end = text.index("}", i)
            nums = [n.strip() for n in text[i + 1 : end].split(",")]
            lo = int(nums[0]) if nums[0] else 0
            hi: float = lo if len(nums) == 1 else (int(nums[1]) if nums[1] else math.inf)
            i = end + 1
        else:
            lo, hi = {"*": (0, math.inf), "+": (1, math.inf), "?": (0, 1)}[c]
            i += 1
        atom = Span(atom.shortest * lo, atom.longest * (lo + 1 if math.isinf(hi) else hi))
    return atom, i
