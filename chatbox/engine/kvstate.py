"""Memory for llama.cpp sequence state: parked conversations, copies between KV streams.

A conversation's state is large (SmolLM2: ~23 KB a token, 44 MB for 1,900 tokens). Saved
into a ctypes array and copied out as `bytes`, a 1,900-token save took 66 ms, of which
llama.cpp's own copy was 5.6 ms: the rest was zero-filling and copying fresh memory, 4 KB
page fault by page fault. Restoring copied it into a ctypes array again (37 ms; llama.cpp's
read, 5 ms). State now lives in an anonymous mapping advised for transparent huge pages
(2 MB pages: ~20 faults instead of ~11,000): the save took 9 ms, and a restore reads it in
place (4.6 ms). Without the advice (as where the kernel offers no huge pages) it took 27 ms.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import mmap
from typing import Any

# What a save returns and a restore takes: a mapping from `new_state`, or bytes (a test's
# fake, or a state that llama.cpp wrote shorter than it sized).
State = bytes | mmap.mmap


def new_state(size: int) -> mmap.mmap:
    """Writable, zeroed memory for `size` bytes of state (size > 0)."""
    # private: a shared anonymous mapping is shmem, which huge pages skip by default
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)  # Linux only
    if advice is not None:
        with contextlib.suppress(OSError):  # the kernel may not offer huge pages
            buf.madvise(advice)
    return buf


def pointer(data: State) -> Any:
    """A `uint8_t *` to the state's bytes for llama.cpp, without copying them (llama.cpp
    only reads them; the caller keeps `data` alive for the call)."""
    if isinstance(data, mmap.mmap):
        return (ctypes.c_uint8 * len(data)).from_buffer(data)
    return ctypes.cast(ctypes.c_char_p(data), ctypes.POINTER(ctypes.c_uint8))


def read_state(f: io.BufferedIOBase, size: int) -> State | None:
    """`size` bytes of state from a file into new state memory; None if the file is short."""
    if size == 0:
        return b""
    buf = new_state(size)
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
