"""State memory for parked KV: what llama.cpp is handed is the state's own bytes."""

from __future__ import annotations

import ctypes
import io

from chatbox.engine.kvstate import new_state, pointer, read_state


def test_new_state_is_zeroed_writable_memory_of_the_size_asked() -> None:
    buf = new_state(3 * 1024 * 1024)
    assert len(buf) == 3 * 1024 * 1024
    assert buf[:16] == bytes(16) and buf[-16:] == bytes(16)
    buf[-1] = 7
    assert buf[-1] == 7


def test_pointer_reads_the_state_in_place_for_both_kinds() -> None:
    raw = bytes(range(256)) * 8
    buf = new_state(len(raw))
    buf[:] = raw
    for data in (raw, buf):
        address = ctypes.cast(pointer(data), ctypes.c_void_p).value
        assert address is not None and ctypes.string_at(address, len(raw)) == raw
    # the mapping is not copied: a write to it is what llama.cpp would read next
    p = pointer(buf)
    buf[0] = 255
    assert p[0] == 255


def test_read_state_fills_new_memory_and_refuses_a_short_file() -> None:
    raw = bytes(range(200)) * 5000  # ~1 MB, read in more than one piece by a small buffer
    got = read_state(io.BufferedReader(io.BytesIO(raw), buffer_size=4096), len(raw))
    assert got is not None and bytes(got) == raw
    assert read_state(io.BufferedReader(io.BytesIO(raw[:-1])), len(raw)) is None
    assert read_state(io.BufferedReader(io.BytesIO(b"")), 0) == b""
