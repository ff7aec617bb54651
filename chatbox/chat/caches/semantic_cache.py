"""The semantic answer cache: a first question in a new conversation (no history, no
document passages, no memory in its prompt) that means what an earlier one of the same
scope meant gets that question's answer again, labelled as cached, without model work.

Opt-in per tier (`[semantic_cache] tiers` in the policy). A lookup embeds the question with
the MiniLM encoder the box already runs and takes the nearest kept question of the same
partition; it is a hit when the cosine similarity reaches the policy's `threshold` and the
two questions' specifics agree (`same_specifics`: numbers, names and quoted text, and the
order of the words they share). Similarity alone cannot tell "convert Celsius to
Fahrenheit" from its reverse (0.995): benchmarks/semantic_cache.py measures false hits on a
labelled paraphrase set with the guard on, and the threshold shipped is the lowest with none.

A partition holds the scope (the user's id, the workspace's, or `tier:<name>` for a tier the
policy declares public), the model and its file identity, the moderation rules and the
system prompt and sampling the answer was made with: an answer made under other rules is
never served. Entries live in RAM (bounded, with a lifetime), are declared in the content
registry (chatbox/store/content.py) and dropped with their account or conversation. Whether
a turn may use the cache at all (first turn, zero retention, moderation) is the chat
service's to decide (`ChatService`)."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

import numpy as np

from chatbox.chat.policy import SemanticCachePolicy
from chatbox.engine.types import DoneEvent, EngineEvent, TokenEvent, Usage

CACHED_ROUTE = "cached"  # an answer served from this cache: its turn's route says so
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*|\d+(?:[.,]\d+)*|[%+*/×÷=<>-]")
_QUOTED = re.compile(r"\"([^\"]+)\"|“([^”]+)”")


def _listed(text: str) -> list[str]:
    return text.split()


# Numbers, and the words that say what to do with them: a question that differs in any of
# them asks for another answer however alike it reads.
_SPECIFIC = frozenset(
    _listed(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
        " fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy"
        " eighty ninety hundred thousand million billion half quarter percent plus minus times"
    )
    + _listed(" multiplied divided squared cubed % + * / × ÷ = < > -")
)
# Words whose opposite in the other question turns the question around ("is coffee good
# for the heart" is not "is coffee bad for the heart", at a similarity of 0.95).
_OPPOSITES = {
    frozenset(pair.split("/"))
    for pair in _listed(
        "good/bad best/worst start/end begin/end beginning/end first/last before/after"
        " open/close read/write open/write key/value keys/values min/max minimum/maximum"
        " largest/smallest biggest/smallest tallest/shortest highest/lowest longest/shortest"
        " oldest/youngest fastest/slowest most/least more/less increase/decrease add/remove"
        " create/delete install/uninstall buy/sell import/export encode/decode"
        " encrypt/decrypt upload/download push/pull true/false hot/cold up/down left/right"
        " north/south east/west in/out pros/cons advantages/disadvantages cheap/expensive"
        " fast/slow over/under above/below men/women male/female day/night summer/winter"
        " morning/evening safe/dangerous legal/illegal healthy/unhealthy with/without"
        " can/cannot do/don't is/isn't should/shouldn't"
    )
}


def _words(question: str) -> list[str]:
    """The question's words, possessives cut ("France's" is "France")."""
    cleaned = re.sub(r"['’]s\b", "", question)
    return _WORD.findall(cleaned.replace("’", "'"))


def specifics(question: str, names: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """What a question is specifically about, in order: its quoted text, numbers and the
    words that operate on them, and its names (a word written with a capital anywhere but
    first, here or in `names`, e.g. the other question's, so "italy" is "Italy")."""
    quoted = [next(g for g in m.groups() if g).lower() for m in _QUOTED.finditer(question)]
    out: list[str] = list(quoted)
    for i, word in enumerate(_words(question)):
        low = word.lower()
        if low[0].isdigit() or low in _SPECIFIC:
            out.append(low.replace(",", ""))
        elif low in names or (i > 0 and word[0].isupper() and len(word) > 1):
            out.append(low)
    return tuple(out)


def _names(question: str) -> frozenset[str]:
    return frozenset(
        w.lower() for i, w in enumerate(_words(question)) if i > 0 and w[0].isupper() and len(w) > 1
    )


def same_specifics(first: str, second: str) -> bool:
    """Whether two similar questions agree on what would change the answer: the same numbers,
    names and quoted text in the same order ("Celsius to Fahrenheit" is not "Fahrenheit to
    Celsius"), and no word of one whose opposite only the other has."""
    names = _names(first) | _names(second)
    if specifics(first, names) != specifics(second, names):
        return False
    words_a = {w.lower() for w in _words(first)}
    words_b = {w.lower() for w in _words(second)}
    only_a, only_b = words_a - words_b, words_b - words_a
    return not any(frozenset((a, b)) in _OPPOSITES for a in only_a for b in only_b)


def partition_key(
    scope: str, model: str, identity: str, moderation: str, system: str, sampling: str
) -> str:
    """The partition a question is looked up in (see the module's docstring)."""
    canonical = json.dumps([scope, model, identity, moderation, system, sampling])
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class CachedTurn:
    """One kept answer to a first question, and what made it."""

    owner: str  # the user whose question it answered (their erasure drops it)
    conversation_id: str  # where it was first answered (its erasure drops it)
    question: str
    vector: np.ndarray
    answer: str
    usage: Usage
    stored_at: float

    @property
    def size(self) -> int:
        return len(self.question.encode()) + len(self.answer.encode()) + self.vector.nbytes


@dataclass(frozen=True)
class SemanticHit:
    entry: CachedTurn
    similarity: float


class SemanticCache:
    """Answers to first questions in RAM, by partition: at most `max_entries`, least recently
    used out first, each kept `ttl_s` at most."""

    def __init__(
        self, policy: SemanticCachePolicy, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.policy = policy
        self.clock = clock
        self._entries: OrderedDict[tuple[str, int], CachedTurn] = OrderedDict()
        self._next = 0
        self._bytes = 0
        self.hits = 0
        self.misses = 0
        self.on_lookup: Callable[[str], None] = lambda outcome: None  # metrics: hit, miss
        self.on_size: Callable[[int, int], None] = lambda entries, size: None  # metrics

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size(self) -> int:
        """The bytes its questions, answers and vectors take."""
        return self._bytes

    def enabled_for(self, tier: str) -> bool:
        return self.policy.max_entries > 0 and tier in self.policy.tiers

    def get(self, partition: str, question: str, vector: np.ndarray) -> SemanticHit | None:
        """The kept answer whose question means this one (counted as a hit or a miss)."""
        now = self.clock()
        best: tuple[float, tuple[str, int]] | None = None
        for key, entry in list(self._entries.items()):
            if now - entry.stored_at > self.policy.ttl_s:
                self._drop(key)
                continue
            if key[0] != partition:
                continue
            similarity = float(np.dot(entry.vector, vector))
            closer = best is None or similarity > best[0]
            if similarity >= self.policy.threshold and closer:
                best = (similarity, key) if same_specifics(entry.question, question) else best
        self.on_size(len(self._entries), self._bytes)
        if best is None:
            self.misses += 1
            self.on_lookup("miss")
            return None
        self._entries.move_to_end(best[1])
        self.hits += 1
        self.on_lookup("hit")
        return SemanticHit(self._entries[best[1]], best[0])

    def put(
        self,
        partition: str,
        owner: str,
        conversation_id: str,
        question: str,
        vector: np.ndarray,
        answer: str,
        usage: Usage,
    ) -> None:
        """Keep a first question's answer."""
        entry = CachedTurn(
            owner,
            conversation_id,
            question,
            np.asarray(vector, dtype=np.float32),
            answer,
            usage,
            self.clock(),
        )
        self._next += 1
        self._entries[(partition, self._next)] = entry
        self._bytes += entry.size
        while len(self._entries) > self.policy.max_entries:
            self._drop(next(iter(self._entries)))
        self.on_size(len(self._entries), self._bytes)

    def forget(self, owner: str | None = None, conversations: Iterable[str] = ()) -> int:
        """Drop the answers an account's questions wrote, or those first given in these
        conversations (erased); how many."""
        convs = set(conversations)
        keys = [
            k
            for k, e in self._entries.items()
            if (owner is not None and e.owner == owner) or e.conversation_id in convs
        ]
        for key in keys:
            self._drop(key)
        self.on_size(len(self._entries), self._bytes)
        return len(keys)

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0
        self.on_size(0, 0)

    def _drop(self, key: tuple[str, int]) -> None:
        entry = self._entries.pop(key)
        self._bytes -= entry.size


class Replay:
    """A kept answer as a generation: its text in one event, then its usage."""

    def __init__(self, answer: str, usage: Usage) -> None:
        self.answer = answer
        self.usage = usage
        self._cancelled = False

    def __aiter__(self) -> AsyncIterator[EngineEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[EngineEvent]:
        if self._cancelled:
            yield DoneEvent("cancelled", Usage())
            return
        yield TokenEvent(self.answer)
        yield DoneEvent("stop", self.usage)

    def cancel(self) -> None:
        self._cancelled = True
