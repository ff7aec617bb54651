"""Sequence slots, the per-conversation prefix cache, LRU eviction and parking (RAM, disk).

Every llama.cpp sequence id is a `Slot`. A slot is busy while a request runs in it; when the
request ends its KV stays behind as a cached prefix (tagged with the conversation's cache
key). In a unified cache slots share KV cells through seq_cp, and a ledger of "cell groups"
tracks how many distinct cells are in use. With a stream per slot, a prefix is copied as
state (llama.cpp copies across streams only whole buffers, at the next decode), and busy
slots are kept on consecutive sequence ids (`arrange`)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from chatbox.engine.kv import streams
from chatbox.engine.kv.disk import DiskEntry, DiskStore, key_name
from chatbox.engine.kv.parking import Parked, ParkedRam
from chatbox.engine.kv.prefixes import common_prefix, reusable
from chatbox.engine.kv.state import State

MIN_PARK_TOKENS = 32  # shorter prefixes are cheaper to recompute than to park
COVERED_TOKENS = 32  # a conversation a live slot holds all but this many tokens of: not parked
COVERED_MIN_TOKENS = 1024  # ...and only one this long (a 13 MB state or more)
# When an idle conversation is trimmed out of the KV cache, its head stays live (its public
# prefix, or this many tokens): the template and system prompt that the next conversation
# copies with seq_cp. The whole conversation is parked; its next turn restores that.
HEAD_TOKENS = 128


class KvOps(streams.StateOps, Protocol):
    """The subset of llama.Context the slot table needs (a fake in unit tests)."""

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None: ...


@dataclass
class Slot:
    seq: int
    tokens: list[int] = field(default_factory=list)  # exactly what is in KV, positions 0..n-1
    cache_key: str | None = None
    scope: str | None = None  # whose private text the KV holds (see GenerationRequest)
    public: int = 0  # leading tokens that anyone may reuse (template, configured prompts)
    busy: bool = False
    persist: bool = True  # may be kept and parked (False: zero data retention)
    forgotten: bool = False  # its conversation was deleted while it ran: drop it on release
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


@dataclass(frozen=True)
class SlotAssignment:
    """A slot given to a request, and how much of its prompt was already in KV."""

    slot: Slot
    reused: int  # prompt tokens already in KV (usage.cached_tokens)
    source: str  # "own", "copy", "parked" or "none"


class SlotTable:
    def __init__(
        self,
        kv: KvOps,
        n_slots: int,
        park_bytes: int = 0,
        disk: DiskStore | None = None,
        shared: bool = True,
    ) -> None:
        self.kv = kv
        self.shared = shared  # one pool of cells (unified KV) or a stream per sequence id
        self.moves = 0  # KV moved between streams to keep busy ids consecutive (arrange)
        self.disk = disk
        self.slots = [Slot(seq=i) for i in range(n_slots)]
        self.park_bytes = park_bytes
        self.parked = ParkedRam(park_bytes)
        self.heads = ParkedRam(streams.HEADS_BYTES)  # public heads' state (streams.copy_head)
        self._arranged = True  # busy slots are on consecutive ids (see arrange)
        self._per_token = 0.0  # state bytes a token, as the last park measured
        self._clock = itertools.count(1)
        self._groups = itertools.count(1)
        self._erased_seen: tuple[int, int] | None = None  # the erasures last acted on

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
        target = own if own is not None else self._spare(idle)
        best, best_n = None, 0
        for s in self.slots:
            n = reusable(
                min(common_prefix(s.tokens, prompt), limit), s.scope, s.public, scope, public
            )
            # of equal sources: the target itself, else the one cheapest to copy from
            cheaper = best is not target and best is not None and len(s.tokens) < len(best.tokens)
            if n > best_n or (n == best_n and n > 0 and (s is target or cheaper)):
                best, best_n = s, n
        if target.tokens and target is not own and not self._covered(target):
            # another conversation's idle slot: keep its KV in RAM (and on disk), also when
            # only its public prefix is reused here (the rest of it is about to be cut)
            self._park(target)
        parked = self.parked.get(cache_key) if cache_key else None
        if parked is None and cache_key is not None:
            parked = self.disk.better(cache_key, scope, prompt, best_n) if self.disk else None
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
        if best is not None and best_n > 0 and self._copy(best, target, best_n, public):
            return self._claim(target, cache_key, scope, public, best_n, "copy")
        return self._claim(target, cache_key, scope, public, 0, "none")

    def _spare(self, idle: list[Slot]) -> Slot:
        """The idle slot a new conversation takes: an empty one (next to the busy ones, so
        that `arrange` has less to move), else the least recently used."""
        empty = [s for s in idle if not s.tokens]
        if not empty:
            return min(idle, key=lambda s: s.last_used)
        busy = [s.seq for s in self.slots if s.busy]
        if not busy or self.shared:
            return empty[0]
        lo, hi = min(busy), max(busy)
        return min(empty, key=lambda s: min(abs(s.seq - lo), abs(s.seq - hi)))

    def _copy(self, src: Slot, target: Slot, n: int, public: int = 0) -> bool:
        """Give the (cleared) target the first n tokens of src's KV (public for both: from
        the heads' cache, with a stream per slot)."""
        if self.shared:  # cells are shared, not copied
            self.kv.seq_cp(src.seq, target.seq, 0, n)
            self._seal(src)
            target.tokens = list(src.tokens[:n])
            target.segments = [list(seg) for seg in src.segments]
            target.truncate(n)
            return True
        if n <= min(public, src.public):
            head = src.tokens[:n]
            if not streams.copy_head(
                self.kv, self.heads, src.seq, target.seq, head, len(src.tokens)
            ):
                return False
        elif not streams.copy_state(self.kv, src.seq, target.seq, n, len(src.tokens)):
            return False
        self.append(target, src.tokens[:n])
        return True

    def arrange(self) -> int:
        """With a stream per slot, keep busy slots on consecutive sequence ids (see
        streams.py). Returns how many slots moved."""
        if self.shared or self._arranged:  # nothing was claimed or released since
            return 0
        pairs, moved = streams.moves(self.slots), 0
        for busy, idle in pairs:
            ok, kept = streams.swap(self.kv, busy, idle)
            if not kept:
                self._clear(idle)
            moved += ok
        self.moves += moved
        self._arranged = moved == len(pairs)
        return moved

    def fork(self, src: Slot) -> Slot | None:
        """A busy slot holding a copy of src's KV (seq_cp, no prefill): another answer to
        the same prompt. None when no slot is idle."""
        idle = [s for s in self.slots if not s.busy and s is not src]
        if not idle:
            return None
        target = self._spare(idle)
        if target.tokens:
            self._park(target)
        self._clear(target)
        if not self._copy(src, target, len(src.tokens)):
            return None
        # No cache key: the conversation's cached prefix stays the first answer's.
        slot = self._claim(target, None, src.scope, src.public, len(src.tokens), "copy").slot
        slot.persist = src.persist
        return slot

    def _claim(
        self, slot: Slot, key: str | None, scope: str | None, public: int, reused: int, source: str
    ) -> SlotAssignment:
        slot.busy, self._arranged = True, False
        slot.cache_key = key
        slot.scope = scope
        slot.public = public
        self._seal(slot)
        self.touch(slot)
        if key is not None:
            self.parked.drop(key)
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
        slot.forgotten = False
        slot.persist = True

    # -- release / eviction ------------------------------------------------------------
    def release(self, slot: Slot, keep: bool) -> None:
        """A request ended: keep its KV as a cached prefix, or free it (cancel/error, and
        always under zero data retention: such KV is never kept, parked or written)."""
        slot.busy, self._arranged = False, False
        self._seal(slot)
        self.touch(slot)
        if not keep or slot.forgotten or not slot.persist:
            self._clear(slot)

    def trim_idle(self, max_idle_cells: int) -> int:
        """Evict (park) LRU idle prefixes until idle-only cells <= max_idle_cells.

        Every live cell costs attention time in every step of a unified cache, so idle
        prefixes beyond the budget are cheaper in host RAM. A conversation's head stays
        live while the budget allows (see HEAD_TOKENS). Returns how many were evicted.
        """
        n = 0
        while self.cells_used() - self.cells_used(busy_only=True) > max_idle_cells:
            if not self.evict_one(keep_head=True):  # only idle prefixes are ever victims
                break
            n += 1
        return n

    def evict_one(self, exclude: Sequence[Slot] = (), keep_head: bool = False) -> bool:
        """Free the least recently used idle cached prefix (parking it if allowed); with
        keep_head, a conversation that could be parked keeps its head live (a head alone
        is freed when it is the victim)."""
        victims = [s for s in self.slots if not s.busy and s.tokens and s not in exclude]
        if not victims:
            return False
        victim = min(victims, key=lambda s: s.last_used)
        head = victim.public if victim.public >= MIN_PARK_TOKENS else HEAD_TOKENS
        key = victim.cache_key
        self._park(victim)
        to_disk = self.disk is not None and victim.persist
        parked = key is not None and (key in self.parked or to_disk)
        if keep_head and parked and len(victim.tokens) > head and self._cut(victim, head):
            victim.cache_key = None  # the conversation is parked; this is only its head
            return True
        self._clear(victim)
        return True

    def _covered(self, slot: Slot) -> bool:
        """Whether another live slot of the same scope holds all but COVERED_TOKENS of the
        slot's conversation: its next turn copies that prefix and prefills the rest, so a
        park of the whole (a 1,700-token state is 22 MB to save and write) buys little."""
        if len(slot.tokens) < COVERED_MIN_TOKENS:  # a short one is cheap to park, and whole
            return False
        least = len(slot.tokens) - COVERED_TOKENS
        return any(
            s is not slot
            and s.scope == slot.scope
            and common_prefix(s.tokens, slot.tokens) >= least
            for s in self.slots
        )

    def _park(self, slot: Slot) -> None:
        if not slot.persist or (self.park_bytes <= 0 and self.disk is None):
            return
        key = slot.cache_key
        if key is not None and self.parked.holds(key, slot.tokens, slot.scope, slot.public):
            self.parked.touch(key)  # parked ahead (park_ahead) and unchanged since
            return
        data = self._saved(slot)
        if data and key is not None:
            self._to_disk(slot, data)
            self.parked.put(Parked(key, list(slot.tokens), data, slot.scope, slot.public))
            self._per_token = len(data) / len(slot.tokens)

    def park_ahead(self) -> bool:
        """Park the least recently used idle live conversation that is not parked as it is,
        keeping it live (idle.py). False when none is left, when it would push a parked
        one out of the RAM budget, or when it could not be parked in RAM (parking off, a
        state bigger than the budget, a failed save): the idle loop would try it again."""
        if self.park_bytes <= 0:
            return False
        for slot in sorted(self.slots, key=lambda s: s.last_used):
            key = slot.cache_key
            if slot.busy or key is None or len(slot.tokens) < MIN_PARK_TOKENS:
                continue
            if self.parked.holds(key, slot.tokens, slot.scope, slot.public):
                continue
            if self.parked.size + len(slot.tokens) * self._per_token > self.park_bytes:
                return False
            self._park(slot)
            return self.parked.holds(key, slot.tokens, slot.scope, slot.public)
        return False

    def _saved(self, slot: Slot) -> State:
        """The slot's KV as state bytes; empty when it may not be parked (zero data
        retention), is not worth it (no key, shorter than MIN_PARK_TOKENS) or llama.cpp
        could not save it. Every park, to RAM or disk, goes through here."""
        if not slot.persist or slot.cache_key is None or len(slot.tokens) < MIN_PARK_TOKENS:
            return b""
        try:
            return self.kv.seq_save(slot.seq)
        except Exception:
            return b""

    def _to_disk(self, slot: Slot, data: State) -> bool:
        """Queue the slot's KV for the disk (written by the disk's own thread), if it may go."""
        if self.disk is None or not slot.persist or slot.cache_key is None:
            return False
        entry = DiskEntry(list(slot.tokens), slot.scope, slot.public)
        return self.disk.save(slot.cache_key, entry, data)

    def _restore(self, target: Slot, parked: Parked) -> bool:
        self._clear(target)
        while not self.kv.seq_restore(target.seq, parked.data):
            self.kv.seq_rm(target.seq, -1, -1)
            # make room in the pool (restores need free cells); a stream holds only its own
            if not self.shared or not self.evict_one(exclude=(target,)):
                return False
        self.parked.drop(parked.cache_key)
        self.append(target, parked.tokens)
        target.scope, target.public = parked.scope, parked.public
        return True

    # -- deletion and shutdown ---------------------------------------------------------
    def forget(self, key: str) -> threading.Event | None:
        """Drop a conversation's KV everywhere: live (now, or when its request ends), RAM
        and disk (queued after any write of it, see DiskStore.forget)."""
        for slot in self.slots:
            if slot.cache_key == key:
                if slot.busy:
                    slot.forgotten = True
                else:
                    self._clear(slot)
        self.parked.drop(key)
        return self.disk.forget(key) if self.disk is not None else None

    def forget_scope(self, scope: str) -> threading.Event | None:
        """Drop every KV of a scope (an erased account's) everywhere, as `forget` does."""
        for slot in self.slots:
            if slot.scope == scope:
                if slot.busy:
                    slot.forgotten = True
                else:
                    self._clear(slot)
        for key in list(self.parked):
            item = self.parked.get(key)
            if item is not None and item.scope == scope:
                self.parked.drop(key)
        return self.disk.forget_scope(scope) if self.disk is not None else None

    def drop_erased(self) -> int:
        """Drop the live and RAM-parked KV of keys and scopes that another process (the
        CLI) erased since the last look (`engine.kv.disk.Erasures`); returns how many went."""
        erased = self.disk.erased if self.disk is not None else None
        if erased is None or erased.stamp() == self._erased_seen:
            return 0
        self._erased_seen = erased.stamp()
        n = 0
        for slot in self.slots:
            if slot.tokens and erased.holds(key_name(slot.cache_key or ""), slot.scope):
                if slot.busy:
                    slot.forgotten = True
                else:
                    self._clear(slot)
                n += 1
        for key in list(self.parked):
            item = self.parked.get(key)
            if item is not None and erased.holds(key_name(key), item.scope):
                self.parked.drop(key)
                n += 1
        return n

    def park_all_to_disk(self) -> int:
        """Write every idle conversation's live KV to disk (before a shutdown); return how many."""
        n = 0
        for slot in self.slots:
            if not slot.busy and self.disk is not None and slot.persist:
                data = self._saved(slot)
                n += bool(data) and self._to_disk(slot, data)
        return n
