"""KV streams: one per slot (llama.cpp's `kv_unified = false`, as llama-server keeps them).

A decoding token's attention then scans only its own conversation's cells, not every cell
in use (8 streams at a 256-token context: 259 tokens/s against 187 in one pool, on 2
cores). Two rules of llama.cpp shape the rest: it copies KV across streams only as whole
buffers and only at the next decode, so a prefix moves as state (save, restore, cut); and
it packs one pass per run of consecutive sequence ids, so busy slots are kept on
consecutive ids (busy ids 0, 2, 4, 6 cost four passes a step instead of one).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol, TypeVar

HEADS_BYTES = 64 * 1024 * 1024  # state of public heads kept for new conversations


class StateOps(Protocol):
    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool: ...

    def seq_save(self, seq: int) -> bytes: ...

    def seq_restore(self, seq: int, data: bytes) -> bool: ...


class StreamSlot(Protocol):
    seq: int
    tokens: list[int]
    busy: bool


S = TypeVar("S", bound=StreamSlot)


def copy_state(kv: StateOps, src: int, dst: int, n: int, held: int) -> bool:
    """Copy the first n of src's `held` tokens into the empty stream dst; False (dst left
    empty) when llama.cpp refuses."""
    try:
        data = kv.seq_save(src)
    except Exception:
        return False
    if not data or not kv.seq_restore(dst, data):
        kv.seq_rm(dst, -1, -1)
        return False
    if n < held and not kv.seq_rm(dst, n, -1):
        kv.seq_rm(dst, -1, -1)
        return False
    return True


class Heads:
    """The state of public heads (the template around configured prompts, never a user's
    text), by their tokens, least recently used first out past HEADS_BYTES.

    A new conversation's head is copied out of another stream by saving all of that stream
    (a 100-token conversation in ~1.5 ms, an 1,800-token one in ~60 ms, on 2 cores); from
    here it is one restore of the head alone (~0.1 ms for 30 tokens).
    """

    def __init__(self, max_bytes: int = HEADS_BYTES) -> None:
        self.max_bytes = max_bytes
        self._states: OrderedDict[tuple[int, ...], bytes] = OrderedDict()
        self._bytes = 0

    def get(self, tokens: Sequence[int]) -> bytes | None:
        data = self._states.get(tuple(tokens))
        if data is not None:
            self._states.move_to_end(tuple(tokens))
        return data

    def clear(self) -> None:
        self._states.clear()
        self._bytes = 0

    def put(self, tokens: Sequence[int], data: bytes) -> None:
        key = tuple(tokens)
        if key in self._states or not data or len(data) > self.max_bytes:
            return
        self._states[key] = data
        self._bytes += len(data)
        while self._bytes > self.max_bytes:
            self._bytes -= len(self._states.popitem(last=False)[1])


def copy_head(
    kv: StateOps, heads: Heads, src: int, dst: int, tokens: Sequence[int], held: int
) -> bool:
    """Copy the public head `tokens` (the first of src's `held`) into the empty stream dst,
    from `heads` when it holds them, else out of src (and keep the head's state there)."""
    data = heads.get(tokens)
    if data is not None:
        if kv.seq_restore(dst, data):
            return True
        kv.seq_rm(dst, -1, -1)
    if not copy_state(kv, src, dst, len(tokens), held):
        return False
    with contextlib.suppress(Exception):  # it is only a cache
        heads.put(tokens, kv.seq_save(dst))
    return True


def moves(slots: Sequence[S]) -> list[tuple[S, S]]:
    """(busy slot, idle slot) pairs to swap so that busy slots hold consecutive ids: the
    window of ids that already holds the most busy slots is filled, fewest moves first."""
    busy = sorted(s.seq for s in slots if s.busy)
    k = len(busy)
    if k <= 1 or busy[-1] - busy[0] == k - 1:
        return []
    by_seq = {s.seq: s for s in slots}
    start = max(range(len(slots) - k + 1), key=lambda a: sum(a <= q < a + k for q in busy))
    outside = [by_seq[q] for q in busy if not start <= q < start + k]
    holes = [by_seq[q] for q in range(start, start + k) if not by_seq[q].busy]
    return list(zip(outside, holes, strict=True))


def swap(kv: StateOps, busy: StreamSlot, idle: StreamSlot) -> tuple[bool, bool]:
    """Exchange the streams (and seq ids) of a busy slot and an idle one, keeping the idle
    one's KV too. Returns (moved, idle kept): when not moved nothing changed for the busy
    slot; when the idle one's KV was lost the caller clears it."""
    try:
        data = kv.seq_save(busy.seq) if busy.tokens else b""
        spare = kv.seq_save(idle.seq) if idle.tokens else b""
    except Exception:
        return False, True
    kv.seq_rm(idle.seq, -1, -1)
    if data and not kv.seq_restore(idle.seq, data):
        kv.seq_rm(idle.seq, -1, -1)
        return False, not spare or kv.seq_restore(idle.seq, spare)
    kv.seq_rm(busy.seq, -1, -1)
    busy.seq, idle.seq = idle.seq, busy.seq
    return True, not spare or kv.seq_restore(idle.seq, spare)
