"""Verdicts of texts already checked, so a text is embedded and scored once: an OpenAI-API
client sends the whole conversation again on every call, a regenerate or an edit sends the
same history again, and only what is new needs the classifier.

The cache lives in RAM only (never written anywhere), holds at most `max_entries` verdicts
(least recently used go first) and never holds text: an entry is a digest of the text with
its scope, and the verdict (action, category, scores, rule name)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Generic, TypeVar

V = TypeVar("V")  # the moderator's Verdict (kept generic: the checker imports this module)

# About 1 KB a verdict (its scores dict and the digest): 20,000 of them is ~20 MB.
MAX_ENTRIES = 20_000


def verdict_key(scope: str, version: str, tier: str, direction: str, text: str) -> bytes:
    """The entry of `text` checked for `scope` (a user) under the moderator's `version` (the
    policy and the classifiers loaded), a tier and a direction: a 16-byte digest, no text."""
    h = hashlib.blake2b(digest_size=16)
    for part in (scope, version, tier, direction):
        h.update(part.encode())
        h.update(b"\0")
    h.update(text.encode("utf-8", "surrogatepass"))
    return h.digest()


class VerdictCache(Generic[V]):
    """An LRU map from `verdict_key` digests to verdicts, bounded by entries."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[bytes, V] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> V | None:
        verdict = self._entries.get(key)
        if verdict is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return verdict

    def put(self, key: bytes, verdict: V) -> None:
        self._entries[key] = verdict
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()
