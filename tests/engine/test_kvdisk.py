"""Parked KV on disk: a conversation stays warm across eviction and restarts, and only for
its own scope; damaged files are ignored; the directory is size-capped LRU."""

from __future__ import annotations

import json
import os
import struct
import threading
import zlib
from array import array
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from chatbox.engine.engine import LlamaEngine
from chatbox.engine.kv import disk as kvdisk
from chatbox.engine.kv.disk import (
    SUFFIX,
    DiskEntry,
    DiskStore,
    Erasures,
    erase_files,
    forget_everywhere,
    key_name,
)
from chatbox.engine.kv.state import StatePool
from chatbox.engine.types import ChatMessage, GenerationRequest
from tests.engine.conftest import TINY_SETTINGS
from tests.engine.helpers import GREEDY, Result, collect

HISTORY = "Here is a long story about a lighthouse keeper and a storm at sea. " * 6


def files(kv_dir: Path) -> list[Path]:
    return sorted(kv_dir.rglob("*" + SUFFIX))


async def turn(
    engine: LlamaEngine,
    msgs: tuple[ChatMessage, ...],
    key: str = "conv-1",
    scope: str | None = "alice",
    persist: bool = True,
) -> Result:
    req = GenerationRequest(msgs, GREEDY, cache_key=key, cache_scope=scope, persist=persist)
    return await collect(engine.submit(req, capture_logits=1))


async def started(path: Path, kv_dir: Path, **kw: object) -> LlamaEngine:
    engine = LlamaEngine(path, "tiny", replace(TINY_SETTINGS, kv_dir=kv_dir, **kw))  # type: ignore[arg-type]
    await engine.start()
    return engine


async def stopped(engine: LlamaEngine) -> None:
    await engine.stop()
    engine.close()


def first_and_second() -> tuple[tuple[ChatMessage, ...], tuple[ChatMessage, ...]]:
    first = (ChatMessage("user", HISTORY),)
    return first, (*first, ChatMessage("assistant", "It was dark."), ChatMessage("user", "Go on"))


async def test_evicted_conversation_is_warm_after_a_restart(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    kv = tmp_path / "kv"
    first, second = first_and_second()
    # idle_kv_cells=0: a finished conversation leaves the KV cache at once (parked)
    a = await started(tiny_gguf, kv, idle_kv_cells=0, park_bytes=0)
    r1 = await turn(a, first)
    await stopped(a)
    assert len(files(kv)) == 1
    b = await started(tiny_gguf, kv)
    try:
        warm = await turn(b, second)
        assert warm.done.usage.cached_tokens >= r1.done.usage.prompt_tokens - 1
        await b.clear_cache()
        cold = await turn(b, second)
        assert cold.done.usage.cached_tokens == 0
        assert int(np.argmax(warm.logits[0])) == int(np.argmax(cold.logits[0]))
        # a restored prefix was computed in other batch shapes than one cold prefill
        assert np.max(np.abs(warm.logits[0] - cold.logits[0])) < 5e-2
    finally:
        await stopped(b)


async def test_idle_conversations_are_parked_at_shutdown(tiny_gguf: Path, tmp_path: Path) -> None:
    kv = tmp_path / "kv"
    first, second = first_and_second()
    a = await started(tiny_gguf, kv, idle_kv_cells=4096)  # it stays live in KV until the stop
    r1 = await turn(a, first)
    await stopped(a)
    b = await started(tiny_gguf, kv, idle_kv_cells=4096)
    try:
        other = await turn(b, second, scope="mallory")  # same key, another user's turn
        assert other.done.usage.cached_tokens == 0
        mine = await turn(b, second)
        assert mine.done.usage.cached_tokens >= r1.done.usage.prompt_tokens - 1
    finally:
        await stopped(b)


async def test_zero_retention_turns_never_reach_the_disk(tiny_gguf: Path, tmp_path: Path) -> None:
    kv = tmp_path / "kv"
    first, _ = first_and_second()
    a = await started(tiny_gguf, kv, idle_kv_cells=0)
    await turn(a, first, persist=False)
    await turn(a, first, key="conv-2", persist=False)
    await stopped(a)
    assert files(kv) == []


async def test_forget_deletes_parked_kv(tiny_gguf: Path, tmp_path: Path) -> None:
    kv = tmp_path / "kv"
    first, second = first_and_second()
    a = await started(tiny_gguf, kv, idle_kv_cells=0)
    await turn(a, first)
    await turn(a, first, key="conv-2")
    await a.forget("conv-1")
    assert [p.name for p in files(kv)] == [key_name("conv-2")]
    again = await turn(a, second)  # neither RAM nor disk nor live KV holds it any more
    assert again.done.usage.cached_tokens == 0
    await stopped(a)


async def test_damaged_files_are_ignored(tiny_gguf: Path, tmp_path: Path) -> None:
    kv = tmp_path / "kv"
    first, second = first_and_second()
    a = await started(tiny_gguf, kv, idle_kv_cells=0, park_bytes=0)
    await turn(a, first)
    await turn(a, first, key="conv-2", scope="bob")
    await stopped(a)
    by_name = {p.name: p for p in files(kv)}
    truncated, flipped = by_name[key_name("conv-1")], by_name[key_name("conv-2")]
    os.truncate(truncated, truncated.stat().st_size // 2)  # a crash mid-write
    data = bytearray(flipped.read_bytes())
    data[-100] ^= 0xFF  # a bad sector
    flipped.write_bytes(bytes(data))
    (truncated.parent / "partial.kv.tmp").write_bytes(b"CBKV")  # an interrupted write
    b = await started(tiny_gguf, kv)
    try:
        for key, scope in (("conv-1", "alice"), ("conv-2", "bob")):
            r = await turn(b, second, key=key, scope=scope)
            assert r.done.usage.cached_tokens < 10  # at most the template's public opening
            assert r.done.finish_reason == "length"
        assert not (truncated.parent / "partial.kv.tmp").exists()
    finally:
        await stopped(b)


def test_store_round_trip_and_lru_cap(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, cap_bytes=2000)  # three files of ~600 bytes fit, not four
    entry = DiskEntry(list(range(10)), "alice", 7)
    for i in range(3):
        store.save(f"k{i}", entry, bytes([i]) * 500)
        store.forget("nothing").wait()  # the writer has caught up
        os.utime(tmp_path / key_name(f"k{i}"), (1000 + i, 1000 + i))
    loaded = store.load("k0")  # a restore makes k0 the most recently used
    assert loaded is not None and loaded[0] == entry and bytes(loaded[1]) == bytes([0]) * 500
    store.save("k3", entry, b"x" * 500)
    store.forget("nothing").wait()
    assert "k0" in store and "k3" in store
    assert "k1" not in store  # the least recently used went first
    assert store.size <= 2000
    store.close()
    reopened = DiskStore(tmp_path, cap_bytes=2000)  # the index is rebuilt from the files
    assert "k0" in reopened and "k1" not in reopened
    reopened.close()


def test_a_file_of_the_crc32_format_is_still_read_and_checked(tmp_path: Path) -> None:
    """Parks written before the checksum became XXH3 restore after an upgrade; a damaged one
    is refused as before."""

    def old_file(key: str, state: bytes, crc_of: bytes) -> None:
        meta = json.dumps({"scope": "alice", "public": 3}).encode()
        toks = array("i", range(10)).tobytes()
        crc = zlib.crc32(crc_of, zlib.crc32(toks, zlib.crc32(meta)))
        head = struct.pack("<5sIIQI", b"CBKV\x01", len(meta), 10, len(state), crc)
        (tmp_path / key_name(key)).write_bytes(head + meta + toks + state)

    old_file("kept", b"s" * 700, b"s" * 700)
    old_file("rotted", b"s" * 700, b"t" * 700)
    store = DiskStore(tmp_path, cap_bytes=1 << 20)
    got = store.load("kept")
    assert got is not None and got[0] == DiskEntry(list(range(10)), "alice", 3)
    assert bytes(got[1]) == b"s" * 700
    assert store.load("rotted") is None and "rotted" not in store  # deleted, as any bad file
    store.save("new", DiskEntry([1, 2], "bob", 0), b"n" * 700)
    store.forget("nothing").wait()
    assert (tmp_path / key_name("new")).read_bytes()[:5] == kvdisk.MAGIC
    again = store.load("new")
    assert again is not None and bytes(again[1]) == b"n" * 700
    store.close()


def test_the_writer_runs_at_the_lowest_priority(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, cap_bytes=2000)
    tid = store._thread.native_id
    assert tid is not None
    assert os.getpriority(os.PRIO_PROCESS, tid) == 19  # it never takes a core from decoding
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) < 19  # only the writer
    store.close()


def test_writes_past_the_pending_cap_are_skipped_not_queued(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, cap_bytes=10_000, pending_cap=1200)
    entry = DiskEntry([1, 2, 3], "alice", 0)
    gate = threading.Event()
    store._queue.put(gate.wait)  # a writer that cannot get the CPU (or the disk) for now
    store.save("k0", entry, b"a" * 500)
    store.save("k1", entry, b"b" * 500)
    store.save("k2", entry, b"c" * 500)  # 1,500 bytes would be waiting: skipped
    assert store.pending == 1000 and store.skipped == 1
    gate.set()
    store.forget("nothing").wait()
    assert "k0" in store and "k1" in store and "k2" not in store
    assert store.pending == 0
    store.save("k2", entry, b"c" * 500)  # caught up: written again
    store.forget("nothing").wait()
    assert "k2" in store
    store.close()


def test_writes_wait_while_the_engine_decodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kvdisk, "CHUNK", 100)
    monkeypatch.setattr(kvdisk, "TRICKLE_S", 30.0)  # under load: a piece now and then
    store = DiskStore(tmp_path, cap_bytes=10_000)
    entry = DiskEntry([1, 2, 3], "alice", 0)
    store.decoding(True)
    store.save("k0", entry, b"a" * 500)
    done = store.forget("nothing")
    assert not done.wait(0.5)  # five pieces to write: still waiting for a pause
    assert "k0" not in store and not files(tmp_path)
    store.decoding(False)  # the engine is idle: the rest goes at once
    assert done.wait(5)
    assert "k0" in store
    got = store.load("k0")
    assert got is not None and (got[0], bytes(got[1])) == (entry, b"a" * 500)
    store.close()


def test_shutdown_writes_what_waits_even_mid_decode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kvdisk, "TRICKLE_S", 30.0)
    store = DiskStore(tmp_path, cap_bytes=10_000)
    store.decoding(True)  # the engine stopped without saying it was idle
    store.save("k0", DiskEntry([1], None, 0), b"z" * 300)
    store.close()
    reopened = DiskStore(tmp_path, cap_bytes=10_000)
    got = reopened.load("k0")
    assert got is not None and (got[0], bytes(got[1])) == (DiskEntry([1], None, 0), b"z" * 300)
    reopened.close()


def test_an_erased_key_or_scope_is_never_written_again(tmp_path: Path) -> None:
    kv = tmp_path / "kv"
    store = DiskStore(kv / "model", cap_bytes=10_000)
    alice = DiskEntry([1, 2, 3], "alice", 0)
    store.save("conv-1", alice, b"a" * 300)
    store.save("bob-api", DiskEntry([4], "bob", 0), b"b" * 300)
    store.forget("nothing").wait()
    # another process (the CLI) erases a conversation and an account
    assert erase_files(kv, keys=["conv-1"], scopes=["bob"]) == 2
    assert files(kv) == []
    assert not store.save("conv-1", alice, b"a" * 300)  # a RAM copy parked again: refused
    assert not store.save("bob-other", DiskEntry([5], "bob", 0), b"b" * 300)
    assert store.save("conv-2", alice, b"c" * 300)  # the rest is parked as ever
    store.close()
    assert [p.name for p in files(kv)] == [key_name("conv-2")]
    assert forget_everywhere(kv, "conv-2") == 1  # the list of erasures is no model's folder


def test_a_write_that_crosses_an_erasure_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kvdisk, "CHUNK", 100)
    kv = tmp_path / "kv"
    store = DiskStore(kv / "model", cap_bytes=10_000)
    store.decoding(True)  # the write trickles: it is still going when the erasure comes
    assert store.save("conv-1", DiskEntry([1], "alice", 0), b"a" * 500)
    Erasures(kv).add(scopes=["alice"])  # recorded only, as a crash before the deletes
    store.close()
    assert files(kv) == []
    # a file written before an erasure whose deletes never ran goes at the next start
    store = DiskStore(kv / "model", cap_bytes=10_000)
    store.save("conv-2", DiskEntry([1], "carol", 0), b"c" * 300)
    store.close()
    Erasures(kv).add(keys=["conv-2"])
    DiskStore(kv / "model", cap_bytes=10_000).close()
    assert files(kv) == []


async def test_forget_scope_drops_an_accounts_kv_live_in_ram_and_on_disk(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    kv = tmp_path / "kv"
    first, second = first_and_second()
    a = await started(tiny_gguf, kv, idle_kv_cells=0)
    await turn(a, first, key="openai:1")
    await turn(a, first, key="conv-2", scope="bob")
    await turn(a, first, key="openai:3")  # live, parked in RAM and on disk
    await a.forget_scope("alice")
    assert [p.name for p in files(kv)] == [key_name("conv-2")]
    again = await turn(a, second, key="openai:3")
    assert again.done.usage.cached_tokens < 10  # at most the template's public opening
    await a.forget_scope("alice")
    await stopped(a)
    assert [p.name for p in files(kv)] == [key_name("conv-2")]


def test_a_written_state_lets_its_memory_go_before_the_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = StatePool(keep_bytes=64 * 1024 * 1024)
    store = DiskStore(tmp_path, cap_bytes=64 * 1024 * 1024, states=pool)
    syncing, synced = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:  # a disk that takes its time
        syncing.set()
        synced.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(kvdisk.os, "fsync", slow_fsync)
    state = pool.take(3 * 1024 * 1024)
    state[:4] = b"kv!!"
    assert store.save("k0", DiskEntry([1, 2], "alice", 0), state)
    del state
    assert syncing.wait(10)  # its bytes are in the file, the disk still syncing
    again = pool.take(3 * 1024 * 1024)
    assert pool.reused == 1  # the next save already reuses its memory
    synced.set()
    store.forget("nothing").wait(10)
    got = store.load("k0")
    assert got is not None and bytes(got[1][:4]) == b"kv!!"
    del again
    store.close()


def test_a_park_still_on_its_way_to_the_disk_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follow-up that comes while its prefix is being parked reuses it: from memory while
    the write waits, from the written file while the disk syncs, from the file after; never
    another scope's, and never once it is forgotten."""
    store = DiskStore(tmp_path, cap_bytes=64 * 1024 * 1024)
    entry = DiskEntry(list(range(40)), "alice", 0)
    prompt = [*range(40), 99, 100]
    gate = threading.Event()
    store._queue.put(gate.wait)  # the writer is busy with an earlier park
    assert store.save("conv", entry, b"s" * 4096)
    queued = store.better("conv", "alice", prompt, 0)
    assert queued is not None and queued.tokens == entry.tokens
    assert bytes(queued.data) == b"s" * 4096
    assert store.better("conv", "bob", prompt, 0) is None  # another scope's: never
    assert store.better("conv", "alice", prompt, 40) is None  # no more than what is cached

    syncing, synced = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        syncing.set()
        synced.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(kvdisk.os, "fsync", slow_fsync)
    gate.set()
    assert syncing.wait(10)  # written, not yet renamed: read from the temporary file
    written = store.better("conv", "alice", prompt, 0)
    assert written is not None and bytes(written.data) == b"s" * 4096
    synced.set()
    store.forget("nothing").wait(10)
    assert "conv" in store
    assert store.better("conv", "alice", prompt, 0) is not None

    again = threading.Event()
    store._queue.put(again.wait)
    assert store.save("gone", entry, b"g" * 4096)
    store.forget("gone")  # erased while queued: not found, not written
    assert store.better("gone", "alice", prompt, 0) is None
    again.set()
    store.forget("nothing").wait(10)
    assert "gone" not in store
    store.close()
