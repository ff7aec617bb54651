"""Sequence slots, the per-conversation prefix cache, LRU eviction and host-RAM parking.

Every llama.cpp sequence id is a `Slot`. A slot is busy while a request runs in it; when the
request ends its KV stays behind as a cached prefix (tagged with the conversation's cache
key). Slots share KV cells through seq_cp in the unified cache; a small ledger of "cell
groups" tracks how many distinct cells are in use.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

MIN_PARK_TOKENS = 32  # shorter prefixes are cheaper to recompute than to park


class KvOps(Protocol):
    """The subset of llama.Context the slot table needs (a fake in unit tests)."""

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool: ...

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None: ...

    def seq_save(self, seq: int) -> bytes: ...

    def seq_restore(self, seq: int, data: bytes) -> bool: ...


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Slot:
    seq: int
    tokens: list[int] = field(default_factory=list)  # exactly what is in KV, positions 0..n-1
    cache_key: str | None = None
    scope: str | None = None  # whose private text the KV holds (see GenerationRequest)
    public: int = 0  # leading tokens that anyone may reuse (template, configured prompts)
    busy: bool = False
    last_used: int = 0
    segments: list[list[int]] = field(default_factory=list)  # [[group, length], ...]

    def truncate(self, n: int) -> None:
        del self.tokens[n:]
        kept: list[list[int]] = []
        left = n
        for group, length in self.segments:
            if left <= 0:
                break
            kept.append([group, min(length, left)])
            left -= length
        self.segments = kept


@dataclass
class Parked:
    cache_key: str
    tokens: list[int]
    data: bytes
    scope: str | None = None
    public: int = 0


def reusable(
    n: int, held_scope: str | None, held_public: int, scope: str | None, public: int
) -> int:
    """How much of a common prefix of n tokens may be reused across these scopes: all of it
    within one scope, only the public part (of both) across scopes or without one."""
    if scope is not None and held_scope == scope:
        return n
    return min(n, public, held_public)


@dataclass(frozen=True)
class SlotAssignment:
    """A slot given to a request, and how much of its prompt was already in KV."""

    slot: Slot
    reused: int  # prompt tokens already in KV (usage.cached_tokens)
    source: str  # "own", "copy", "parked" or "none"


class SlotTable:
    def __init__(self, kv: KvOps, n_slots: int, park_bytes: int = 0) -> None:
        self.kv = kv
        self.slots = [Slot(seq=i) for i in range(n_slots)]
        self.park_bytes = park_bytes
        self.parked: OrderedDict[str, Parked] = OrderedDict()
        self.parked_size = 0
        self._clock = itertools.count(1)
        self._groups = itertools.count(1)

    # -- bookkeeping -------------------------------------------------------------------
    def touch(self, slot: Slot) -> None:
        slot.last_used = next(self._clock)

    def append(self, slot: Slot, tokens: Sequence[int]) -> None:
        """Record tokens that were just decoded into slot's sequence."""
        if not tokens:
            return
        slot.tokens.extend(tokens)
        if slot.segments and slot.segments[-1][0] < 0:  # open group owned by this slot
            slot.segments[-1][1] += len(tokens)
        else:
            slot.segments.append([-next(self._groups), len(tokens)])

    def _seal(self, slot: Slot) -> None:
        """Close the slot's open group so later appends start a new one."""
        for seg in slot.segments:
            seg[0] = abs(seg[0])

    def cells_used(self, busy_only: bool = False) -> int:
        """Distinct KV cells held by all sequences (or by the busy ones)."""
        longest: dict[int, int] = {}
        for slot in self.slots:
            if busy_only and not slot.busy:
                continue
            for group, length in slot.segments:
                g = abs(group)
                if length > longest.get(g, 0):
                    longest[g] = length
        return sum(longest.values())

    @property
    def cached_prefixes(self) -> int:
        return sum(1 for s in self.slots if not s.busy and s.tokens)

    # -- assignment --------------------------------------------------------------------
    def acquire(
        self,
        prompt: Sequence[int],
        cache_key: str | None,
        scope: str | None = None,
        public: int = 0,
    ) -> SlotAssignment | None:
        """Pick an idle slot for the prompt, reusing the longest cached prefix it may see.

        Another scope's KV is reused only up to the public prefix (see `reusable`), so what
        a request reuses (its cached_tokens, its time to first token) never depends on
        another user's private text.
        """
        idle = [s for s in self.slots if not s.busy]
        if not idle:
            return None
        limit = len(prompt) - 1  # the last prompt token is always decoded (we need logits)
        own = next(
            (s for s in idle if cache_key and s.cache_key == cache_key and s.scope == scope), None
        )
        if own is not None:
            target = own
        else:
            empty = [s for s in idle if not s.tokens]
            target = empty[0] if empty else min(idle, key=lambda s: s.last_used)
        best, best_n = None, 0
        for s in self.slots:
            n = reusable(
                min(common_prefix(s.tokens, prompt), limit), s.scope, s.public, scope, public
            )
            if n > best_n or (n == best_n and n > 0 and s is target):
                best, best_n = s, n
        if target is not best and target.tokens and target is not own:
            self._park(target)  # reusing another conversation's idle slot: keep its KV in RAM
        parked = self.parked.get(cache_key) if cache_key else None
        if parked is not None and parked.scope == scope:
            n_parked = min(common_prefix(parked.tokens, prompt), limit)
            if n_parked > best_n and self._restore(target, parked):
                if not self._cut(target, n_parked):
                    n_parked = 0
                return self._claim(target, cache_key, scope, public, n_parked, "parked")
        if best is not None and best is target:
            if not self._cut(target, best_n):
                best_n = 0
            source = "own" if best_n else "none"
            return self._claim(target, cache_key, scope, public, best_n, source)
        self._clear(target)
        if best is not None and best_n > 0:
            self.kv.seq_cp(best.seq, target.seq, 0, best_n)
            self._seal(best)
            target.tokens = list(best.tokens[:best_n])
            target.segments = [list(seg) for seg in best.segments]
            target.truncate(best_n)
            return self._claim(target, cache_key, scope, public, best_n, "copy")
        return self._claim(target, cache_key, scope, public, 0, "none")

    def _claim(
        self, slot: Slot, key: str | None, scope: str | None, public: int, reused: int, source: str
    ) -> SlotAssignment:
        slot.busy = True
        slot.cache_key = key
        slot.scope = scope
        slot.public = public
        self._seal(slot)
        self.touch(slot)
        if key is not None:
            self._drop_parked(key)
        return SlotAssignment(slot, reused, source)

    def _cut(self, slot: Slot, n: int) -> bool:
        if n >= len(slot.tokens):
            return True
        if self.kv.seq_rm(slot.seq, n, -1):
            slot.truncate(n)
            return True
        self._clear(slot)
        return False

    def _clear(self, slot: Slot) -> None:
        if slot.tokens or slot.segments:
            self.kv.seq_rm(slot.seq, -1, -1)
        slot.tokens = []
        slot.segments = []
        slot.cache_key = None
        slot.scope = None
        slot.public = 0

    # -- release / eviction ------------------------------------------------------------
    def release(self, slot: Slot, keep: bool) -> None:
        """A request ended: keep its KV as a cached prefix, or free it (cancel/error)."""
        slot.busy = False
        self._seal(slot)
        self.touch(slot)
        if not keep:
            self._clear(slot)

    def trim_idle(self, max_idle_cells: int) -> int:
        """Evict (park) LRU idle prefixes until idle-only cells <= max_idle_cells.

        Every live cell costs attention time in every step of a unified cache, so idle
        prefixes beyond the budget are cheaper in host RAM. Returns how many were evicted.
        """
        n = 0
        while self.cells_used() - self.cells_used(busy_only=True) > max_idle_cells:
            if not self.evict_one():  # only idle prefixes are ever victims
                break
            n += 1
        return n

    def evict_one(self, exclude: Sequence[Slot] = ()) -> bool:
        """Free the least recently used idle cached prefix (parking it if allowed)."""
        victims = [s for s in self.slots if not s.busy and s.tokens and s not in exclude]
        if not victims:
            return False
        victim = min(victims, key=lambda s: s.last_used)
        self._park(victim)
        self._clear(victim)
        return True

    def _park(self, slot: Slot) -> None:
        if self.park_bytes <= 0 or slot.cache_key is None or len(slot.tokens) < MIN_PARK_TOKENS:
            return
        try:
            data = self.kv.seq_save(slot.seq)
        except Exception:
            return
        if not data or len(data) > self.park_bytes:
            return
        self._drop_parked(slot.cache_key)
        self.parked[slot.cache_key] = Parked(
            slot.cache_key, list(slot.tokens), data, slot.scope, slot.public
        )
        self.parked_size += len(data)
        while self.parked_size > self.park_bytes and self.parked:
            _, old = self.parked.popitem(last=False)
            self.parked_size -= len(old.data)

    def _drop_parked(self, key: str) -> None:
        old = self.parked.pop(key, None)
        if old is not None:
            self.parked_size -= len(old.data)

    def _restore(self, target: Slot, parked: Parked) -> bool:
        self._clear(target)
        while not self.kv.seq_restore(target.seq, parked.data):
            self.kv.seq_rm(target.seq, -1, -1)
            if not self.evict_one(exclude=(target,)):  # make room (restores need free cells)
                return False
        self._drop_parked(parked.cache_key)
        self.append(target, parked.tokens)
        target.scope, target.public = parked.scope, parked.public
        return True
