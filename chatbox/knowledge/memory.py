"""Long-term memory: facts about a user, deduplicated, corrected, and retrieved by meaning."""

from __future__ import annotations

import builtins
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from chatbox.knowledge.embedder import Embedder
from chatbox.knowledge.errors import ContentRefused, NotKept
from chatbox.knowledge.types import KeepsNothing, Screen
from chatbox.knowledge.vector_index import VectorIndex
from chatbox.store import Memory, Store

MAX_FACT_CHARS = 500
DUPLICATE_SIM = 0.88  # this close: the same fact again; keep one (the newer wording)
CONFLICT_SIM = 0.25  # this close and the same single-valued slot: a correction
RELEVANT_SIM = 0.2  # facts below this are not worth a prompt's tokens

# "remember that …" / "please remember: …" at the start of a message.
_REMEMBER = re.compile(
    r"^\s*(?:please\s+)?(?:remember|note|keep in mind)\s*(?:that|:)?\s+(?P<fact>.+)$",
    re.IGNORECASE | re.DOTALL,
)
_FORGET = re.compile(
    r"^\s*(?:please\s+)?forget\s+(?:that\s+)?(?P<fact>.+)$", re.IGNORECASE | re.DOTALL
)
_SUBJECT = {"the", "user", "users", "user's", "i", "my", "me", "i'm", "im", "they", "their"}
# Predicates that hold one value at a time: a new value replaces the old.
_SINGLE_VALUED = {
    "prefer",
    "live",
    "work",
    "called",
    "named",
    "use",
    "favorite",
    "favourite",
    "name",
    "age",
    "based",
    "located",
    "job",
    "role",
    "timezone",
    "from",
}


def explicit_fact(message: str) -> str | None:
    """The fact in a "remember that …" message, or None."""
    m = _REMEMBER.match(message.strip())
    if m is None:
        return None
    fact = m.group("fact").strip().rstrip(".!").strip()
    return fact[:MAX_FACT_CHARS] if len(fact) >= 3 else None


def forget_request(message: str) -> str | None:
    m = _FORGET.match(message.strip())
    return m.group("fact").strip().rstrip(".!") if m else None


def _stem(word: str) -> str:
    if word in {"i'm", "im", "am", "are", "is"}:
        return "is"
    if len(word) > 5 and word.endswith("ing"):
        return word[:-3]
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def _predicate_tokens(fact: str) -> list[str]:
    words = re.findall(r"[a-z0-9']+", fact.lower())
    while words and words[0] in _SUBJECT:
        words.pop(0)
    return [_stem(w) for w in words]


def conflicts(old: str, new: str) -> bool:
    """The same single-valued slot with a different value: "lives in Paris" → "lives in
    Berlin", "prefers metric units" → "prefers imperial units" (not "works at A" → "works
    on B", which can both hold)."""
    a, b = _predicate_tokens(old), _predicate_tokens(new)
    prefix = 0
    while prefix < min(len(a), len(b)) and a[prefix] == b[prefix]:
        prefix += 1
    if prefix == 0 or a == b:
        return False
    suffix = 0
    while suffix < min(len(a), len(b)) - prefix and a[-1 - suffix] == b[-1 - suffix]:
        suffix += 1
    single = any(w in _SINGLE_VALUED for w in a[:prefix])
    return single and (prefix >= 2 or suffix >= 1)


def same_predicate(old: str, new: str) -> bool:
    """Both facts lead with the same word ("works …", "works …"), so one may merge the other."""
    a, b = _predicate_tokens(old), _predicate_tokens(new)
    return bool(a) and bool(b) and a[0] == b[0]


def clean_fact(text: str) -> str:
    return " ".join(text.split()).strip(" -•*").rstrip(".")[:MAX_FACT_CHARS]


@dataclass(frozen=True)
class Change:
    """What adding one fact did: added, merged into an existing fact, or replaced one."""

    action: str  # added | merged | replaced
    memory: Memory
    previous: str | None = None


class MemoryService:
    def __init__(self, store: Store, embedder: Embedder, index: VectorIndex | None = None) -> None:
        self.store = store
        self.embedder = embedder
        self.vectors = index
        self.screen: Screen | None = None  # moderation of facts the user asks to keep
        self.keeps_nothing: KeepsNothing | None = None  # the user's zero-data-retention

    async def nearest(
        self, user_id: str, vector: np.ndarray, k: int
    ) -> builtins.list[tuple[Memory, float]]:
        """The user's k facts nearest to vector, with L2 distances: from the in-RAM index,
        or sqlite-vec when the user's vectors are not held there."""
        hits = (
            await self.vectors.nearest("memory_vec", user_id, vector, k) if self.vectors else None
        )
        if hits is None:
            return await self.store.memories.nearest(user_id, vector, k)
        rows = await self.store.memories.by_seqs(user_id, [seq for seq, _ in hits])
        return [(rows[seq], d) for seq, d in hits if seq in rows]

    async def list(self, user_id: str) -> builtins.list[Memory]:
        return await self.store.memories.list(user_id)

    async def add(
        self,
        user_id: str,
        facts: Sequence[str],
        source: str = "explicit",
        conversation_id: str | None = None,
    ) -> builtins.list[Change]:
        """Add facts; near-duplicates are merged and contradicted facts replaced."""
        texts = [t for t in (clean_fact(f) for f in facts) if t]
        if not texts:
            return []
        await self._refuse_if_kept_nothing(user_id)
        if source == "explicit" and self.screen is not None:
            reason = await self.screen(user_id, texts, "memory", "That fact")
            if reason is not None:
                raise ContentRefused(reason)
        vectors = await self.embedder.embed(texts)
        changes = []
        for text, vector in zip(texts, vectors, strict=True):
            changes.append(await self._add_one(user_id, text, vector, source, conversation_id))
        return changes

    async def _add_one(
        self,
        user_id: str,
        text: str,
        vector: np.ndarray,
        source: str,
        conversation_id: str | None,
    ) -> Change:
        repo = self.store.memories
        for existing, distance in await self.nearest(user_id, vector, 5):
            sim = 1.0 - distance * distance / 2.0  # unit vectors: L2 → cosine
            duplicate = sim >= DUPLICATE_SIM and same_predicate(existing.text, text)
            if duplicate or (sim >= CONFLICT_SIM and conflicts(existing.text, text)):
                # An explicit fact outranks an extracted one; otherwise the newer wins.
                keep_source = "explicit" if "explicit" in (source, existing.source) else source
                updated = await repo.replace(user_id, existing.id, text, vector, keep_source)
                if updated is not None:
                    action = "merged" if duplicate else "replaced"
                    return Change(action, updated, existing.text)
        memory = await repo.add(user_id, text, vector, source, conversation_id)
        return Change("added", memory)

    async def edit(self, user_id: str, memory_id: str, text: str) -> Memory | None:
        """A user's own rewording of one fact (its vector follows); None if not theirs."""
        fact = clean_fact(text)
        if not fact:
            return None
        await self._refuse_if_kept_nothing(user_id)
        vector = await self.embedder.embed_one(fact)
        return await self.store.memories.replace(user_id, memory_id, fact, vector, "explicit")

    async def _refuse_if_kept_nothing(self, user_id: str) -> None:
        if self.keeps_nothing is not None and await self.keeps_nothing(user_id):
            raise NotKept(
                "that fact was not stored: your account keeps no content (zero-data-retention)"
            )

    async def missing(self, user_id: str, memory_ids: Sequence[str]) -> builtins.list[str]:
        """The ids among these that are not facts of this user."""
        return [m for m in memory_ids if await self.store.memories.get(user_id, m) is None]

    async def remove(self, user_id: str, memory_ids: Sequence[str]) -> builtins.list[str]:
        """Delete facts (with their vectors); returns the ids that were found for this user."""
        return await self.store.memories.delete(user_id, list(memory_ids))

    async def forget(self, user_id: str, description: str) -> builtins.list[str]:
        """Delete the facts closest to a "forget that …" description."""
        vector = await self.embedder.embed_one(description)
        hits = await self.nearest(user_id, vector, 3)
        doomed = [m.id for m, d in hits if 1.0 - d * d / 2.0 >= 0.6]
        return await self.remove(user_id, doomed)

    async def relevant(
        self, user_id: str, query: np.ndarray, k: int
    ) -> builtins.list[tuple[Memory, float]]:
        """Up to k of the user's facts most similar to the query vector, with similarity."""
        hits = await self.nearest(user_id, query, k)
        out = [(m, 1.0 - d * d / 2.0) for m, d in hits]
        return [(m, s) for m, s in out if s >= RELEVANT_SIM]

    async def enabled(self, user_id: str) -> bool:
        return await self.store.memories.enabled(user_id)

    async def set_enabled(self, user_id: str, enabled: bool) -> None:
        await self.store.memories.set_enabled(user_id, enabled)
