"""KV streams: one per slot (llama.cpp's `kv_unified = false`, as llama-server keeps them).

A decoding token's attention then scans only its own conversation's cells, not every cell in
use (8 streams decode about 1.4x faster than in one pool on 2 cores). Two rules of llama.cpp
shape the rest: it copies KV across streams only as whole buffers and only at the next
decode, so a prefix moves as state (save, restore, cut); and it packs one pass per run of
consecutive sequence ids, so busy slots are kept on consecutive ids (busy ids 0, 2, 4, 6
cost four passes a step instead of one).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Protocol, TypeVar

from chatbox.engine.kv.parking import Parked, ParkedRam
from chatbox.engine.kv.state import State

HEADS_BYTES = 64 * 1024 * 1024  # state of public heads kept for new conversations


class StateOps(Protocol):
    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool: ...

    def seq_save(self, seq: int) -> State: ...

    def seq_restore(self, seq: int, data: State) -> bool: ...


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


def head_key(tokens: Sequence[int]) -> str:
    """The key a public head's state is kept under (see copy_head)."""
    return "head:" + ",".join(map(str, tokens))


def copy_head(
    kv: StateOps, heads: ParkedRam, src: int, dst: int, tokens: Sequence[int], held: int
) -> bool:
    """Copy the public head `tokens` (the first of src's `held`: the template around the
    configured prompts, never a user's text) into the empty stream dst.

    Out of src it costs a save of all of src (~60 ms for an 1,800-token conversation on 2
    cores), so the head's state is kept in `heads` once copied, and restored from there.
    """
    key = head_key(tokens)
    kept = heads.get(key)
    if kept is not None:
        if kv.seq_restore(dst, kept.data):
            return True
        kv.seq_rm(dst, -1, -1)
    if not copy_state(kv, src, dst, len(tokens), held):
        return False
    with contextlib.suppress(Exception):  # it is only a cache
        heads.put(Parked(key, list(tokens), kv.seq_save(dst)))
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
