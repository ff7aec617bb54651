"""PostgreSQL's full-text search in the terms the knowledge layer asks in (FTS5's)."""

from __future__ import annotations

import re

_PART = re.compile(r'"([^"]*)"(\*?)|\bOR\b')


def tsquery(match: str) -> str:
    """An FTS5 query of quoted words (`"a" OR "b"`, `"a" "b"*`) as `to_tsquery` text: each
    word a term (a prefix where starred), OR as `|`, words side by side as `&`."""
    terms: list[str] = []
    for part in _PART.finditer(match):
        if part.group(0) == "OR":
            if terms and terms[-1] not in "|&":
                terms.append("|")
            continue
        words = re.findall(r"\w+", part.group(1))
        if not words:
            continue
        if terms and terms[-1] not in "|&":
            terms.append("&")
        prefix = ":*" if part.group(2) else ""
        terms.append("(" + " <-> ".join(w + prefix for w in words) + ")")
    while terms and terms[-1] in "|&":
        terms.pop()
    return " ".join(terms)
