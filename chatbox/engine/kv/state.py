"""Memory for llama.cpp sequence state: parked conversations, copies between KV streams.

A conversation's state is large (SmolLM2: ~23 KB a token, 44 MB for 1,900 tokens), and
zero-filling and copying fresh memory 4 KB page fault by page fault would cost a save many
times llama.cpp's own copy. So state lives in private anonymous mappings advised for
transparent huge pages (2 MB pages: ~20 faults instead of ~11,000), and a restore reads it
in place.

Fresh memory can be slow to fault in (a virtual machine's host may back guest memory only on
first touch), so the mappings of states that nobody holds any more are kept (`StatePool`, up
to `KEEP_BYTES`) and the next save or disk read of a similar size writes into one of them.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import mmap
import sys
import threading
import weakref
from typing import Any

# What a save returns and a restore takes: a view of pooled memory, or bytes (a test's
# fake, or a state llama.cpp wrote shorter than it sized).
State = bytes | memoryview

GRAIN = 2 * 1024 * 1024  # mappings of a huge page or more are whole huge pages
PAGE = mmap.PAGESIZE  # smaller ones, whole pages (a head's state is well under 1 MB)
KEEP_BYTES = 128 * 1024 * 1024  # free mappings a pool keeps for later saves


def new_state(size: int) -> mmap.mmap:
    """Writable, zeroed memory for `size` bytes of state (size > 0)."""
    # private: a shared anonymous mapping is shmem, which huge pages skip by default
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)  # Linux only
    if advice is not None:
        with contextlib.suppress(OSError):  # the kernel may not offer huge pages
            buf.madvise(advice)
    return buf


def mapped(size: int) -> int:
    """The size of the mapping a state of `size` bytes gets."""
    grain = GRAIN if size >= GRAIN else PAGE
    return -(-size // grain) * grain


class StatePool:
    """Hands out state memory, and takes a mapping back once nothing holds its view.

    A view is given back by a finalizer when its last reference goes (in whichever
    thread drops it: the decode thread, or the disk writer after writing it). A mapping
    is reused only while nothing else references it: a `memoryview` made from a handed-out
    view refers to the mapping itself, not to the view, and may outlive it.
    """

    def __init__(self, keep_bytes: int = KEEP_BYTES) -> None:
        self.keep_bytes = keep_bytes
        self.free_bytes = 0
        self.reused = 0  # saves that wrote into kept memory
        self._free: list[mmap.mmap] = []
        self._lock = threading.Lock()
        self._unheld = self._refs([new_state(1)])[0]  # a kept mapping that nothing holds

    @staticmethod
    def _refs(maps: list[mmap.mmap]) -> list[int]:
        return [sys.getrefcount(m) for m in maps]

    def take(self, size: int) -> memoryview:
        """`size` bytes of writable state memory (size > 0; contents undefined)."""
        raw = None
        with self._lock:
            # the smallest kept mapping that holds it, if it wastes less than a quarter
            want = mapped(size)
            refs = self._refs(self._free)
            fits = [
                m
                for m, n in zip(self._free, refs, strict=True)
                if n <= self._unheld and want <= len(m) <= want + size // 4
            ]
            if fits:
                raw = min(fits, key=len)
                self._free.remove(raw)
                self.free_bytes -= len(raw)
                self.reused += 1
        if raw is None:
            raw = new_state(mapped(size))
        view = memoryview(raw)[:size]
        weakref.finalize(view, self._give, raw)
        return view

    def _give(self, raw: mmap.mmap) -> None:
        with self._lock:
            while self._free and self.free_bytes + len(raw) > self.keep_bytes:
                self.free_bytes -= len(self._free.pop(0))  # the oldest kept goes first
            if len(raw) <= self.keep_bytes:
                self._free.append(raw)
                self.free_bytes += len(raw)


def pointer(data: State) -> Any:
    """A `uint8_t *` to the state's bytes for llama.cpp, without copying them (llama.cpp
    only reads through it, or writes into pooled memory; the caller keeps `data` alive)."""
    if isinstance(data, bytes):
        return ctypes.cast(ctypes.c_char_p(data), ctypes.POINTER(ctypes.c_uint8))
    return (ctypes.c_uint8 * len(data)).from_buffer(data)


def read_state(f: io.BufferedIOBase, size: int, pool: StatePool) -> State | None:
    """`size` bytes of state from a file into the pool's memory; None if the file is short."""
    if size == 0:
        return b""
    buf = pool.take(size)
    view = memoryview(buf)
    try:
        got = 0
        while got < size:
            n = f.readinto(view[got:])
            if not n:
                return None
            got += n
    finally:
        view.release()
    return buf
