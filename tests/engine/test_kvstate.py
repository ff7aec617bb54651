"""State memory for parked KV: what llama.cpp is handed is the state's own bytes."""

from __future__ import annotations

import ctypes
import io
from pathlib import Path

import numpy as np

from chatbox.engine.kv.state import GRAIN, PAGE, StatePool, mapped, new_state, pointer, read_state
from chatbox.engine.llama import Batch, Context, ContextParams, Model


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


def test_read_state_fills_state_memory_and_refuses_a_short_file() -> None:
    raw = bytes(range(200)) * 5000  # ~1 MB, read in more than one piece by a small buffer
    pool = StatePool()
    got = read_state(io.BufferedReader(io.BytesIO(raw), buffer_size=4096), len(raw), pool)
    assert got is not None and bytes(got) == raw
    assert read_state(io.BufferedReader(io.BytesIO(raw[:-1])), len(raw), pool) is None
    assert read_state(io.BufferedReader(io.BytesIO(b"")), 0, pool) == b""


def test_a_pool_reuses_memory_only_once_nothing_holds_its_view() -> None:
    pool = StatePool(keep_bytes=64 * 1024 * 1024)
    first = pool.take(5 * 1024 * 1024)
    first[:4] = b"keep"
    held = memoryview(first)  # a disk write still reading it, say
    del first
    second = pool.take(5 * 1024 * 1024)
    assert pool.reused == 0  # the first state's memory is still read through `held`
    held.release()
    del held, second
    third = pool.take(5 * 1024 * 1024 - 100)  # a state of about the same size
    assert pool.reused == 1 and len(third) == 5 * 1024 * 1024 - 100


def test_a_pool_keeps_at_most_its_budget_and_no_mapping_far_too_big() -> None:
    pool = StatePool(keep_bytes=8 * 1024 * 1024)
    views = [pool.take(3 * 1024 * 1024) for _ in range(4)]  # 4 MB mappings each
    del views
    assert pool.free_bytes <= 8 * 1024 * 1024
    small = pool.take(64 * 1024)  # would waste nearly all of a 4 MB mapping
    assert pool.reused == 0 and len(small) == 64 * 1024


def test_a_real_context_saves_into_pooled_memory_and_restores_the_same_kv(
    tiny_gguf: Path,
) -> None:
    model = Model(tiny_gguf)
    ctx = Context(model, ContextParams(n_ctx=512, n_seq_max=2, n_batch=64, n_threads=1))
    batch = Batch(64)
    try:
        for i, tok in enumerate([1, 5, 9, 13, 17, 21, 25]):
            batch.add(tok, i, 0, False)
        assert ctx.decode(batch) == 0
        saved = ctx.seq_save(0)
        assert isinstance(saved, memoryview) and len(saved) > 0
        assert ctx.seq_restore(1, saved)
        del saved
        assert ctx.seq_restore(1, ctx.seq_save(1))  # into a reused mapping, and back
        assert ctx.states.reused >= 1
        batch.clear()
        batch.add(29, 7, 0, True)
        batch.add(29, 7, 1, True)
        assert ctx.decode(batch) == 0
        # the restored sequence continues exactly as the original does
        assert np.allclose(ctx.logits(0), ctx.logits(1), atol=1e-5)
    finally:
        batch.free()
        ctx.close()
        model.close()


def test_read_state_reads_into_the_pools_memory() -> None:
    pool = StatePool()
    raw = bytes(range(256)) * 4096
    restored = pool.take(len(raw))
    del restored  # a state restored and dropped: its mapping is kept
    got = read_state(io.BufferedReader(io.BytesIO(raw)), len(raw), pool)
    assert got is not None and bytes(got) == raw and pool.reused == 1


def test_a_small_state_is_not_given_a_huge_page() -> None:
    # a 30-token head is ~0.7 MB: a 2 MB mapping each would triple what the heads' budget holds
    assert mapped(700_000) < 710_000 and mapped(700_000) % PAGE == 0
    assert mapped(GRAIN) == GRAIN and mapped(GRAIN + 1) == 2 * GRAIN
    assert len(StatePool().take(700_000).obj) == mapped(700_000)
