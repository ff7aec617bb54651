"""What of a cached prefix a request may reuse.

Within one user (one cache scope) all of a common prefix; across users only the public
part: the template around the prompts the admin configured, never text a user typed, so
that what a request reuses (its cached_tokens, its time to first token) never depends on
another user's private text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """How many leading tokens (or characters, of two strings) a and b share.

    Slices are compared (in C) while halving the range where they first differ: admitting
    a request compares its prompt with every slot's tokens on the decode thread, where a
    token-by-token loop in Python over two long prompts would cost about three times as much.
    """
    n = min(len(a), len(b))
    x: Sequence[Any]
    y: Sequence[Any]
    if isinstance(a, str) and isinstance(b, str):
        x, y = a[:n], b[:n]
    else:
        x, y = list(a[:n]), list(b[:n])
    if x == y:
        return n
    lo, hi = 0, n  # x[:lo] == y[:lo] and x[:hi] != y[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if x[lo:mid] == y[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def reusable(
    n: int, held_scope: str | None, held_public: int, scope: str | None, public: int
) -> int:
    """How much of a common prefix of n tokens may be reused across these scopes: all of it
    within one scope, only the public part (of both) across scopes or without one."""
    if scope is not None and held_scope == scope:
        return n
    return min(n, public, held_public)
