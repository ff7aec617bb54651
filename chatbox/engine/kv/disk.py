"""The disk tier of parked KV: idle conversations survive eviction from RAM and restarts.

One file per cache key under `<kv_dir>/<model id>/`, where the model id hashes the GGUF
(size, head and tail) and the KV layout, so another model's or another layout's files are
never tried. A file is a fixed header (magic, lengths, an XXH3-64 checksum of everything
after the header), a JSON meta block (scope, public prefix length), the token ids and
llama.cpp's sequence state. XXH3 rather than CRC-32: zlib's CRC-32 was half of a park's
CPU here, XXH3 costs an eighth of it; files of the CRC-32 format are still read. Files are
written to a temporary name, fsynced and renamed, so a crash leaves either the old file, the
new one, or an ignored `*.tmp`; a file whose lengths or checksum do not match is deleted on
read. Writes run on a background thread so the decode
thread never waits for the disk; deletes go through the same queue, so a delete is never
overtaken by an older write. The directory is capped at `cap_bytes`, least recently used
first (mtime, which a restore refreshes).

Writing must not slow decoding down: checksumming and writing a long conversation's state
(~40 MB for 1,800 tokens) streams those bytes through the memory bandwidth that every decode
step needs, whatever the writer's CPU priority. So the state is written in 1 MiB pieces, at
full speed while the engine says it is idle (`decoding(False)`) and one every 0.1 s while it
decodes; the writer also runs at the lowest CPU priority. Past `pending_cap` bytes waiting, a
new write is skipped (the conversation stays parked in RAM, or is recomputed), so a machine
that is never quiet does not queue the disk tier in memory without end.

Erasure may happen in another process (the CLI erasing an account while the server runs and
still holds that account's KV in RAM). So every erasure appends the hashes of the erased
cache keys and scopes to `<kv_dir>/erased` (`Erasures`) before deleting their files, and a
write checks that list before it starts and again after its rename: a file of an erased key
or scope is never written, and one written across the erasure is deleted by whichever of
the two sides comes last. A start deletes any such file it finds.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import queue
import struct
import threading
import zlib
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash

from chatbox.engine.kv.parking import Parked
from chatbox.engine.kv.prefixes import common_prefix
from chatbox.engine.kv.state import State, StatePool, read_state

if TYPE_CHECKING:
    from chatbox.settings import EngineSettings

log = logging.getLogger(__name__)

MAGIC = b"CBKV\x02"
_HEAD = struct.Struct("<5sIIQQ")  # magic, meta bytes, tokens, state bytes, xxh3-64
_CRC_MAGIC = b"CBKV\x01"  # the format before: the same fields, a CRC-32 (read only)
_CRC_HEAD = struct.Struct("<5sIIQI")
SUFFIX = ".kv"
PENDING_CAP = 512 * 1024**2  # bytes of state queued for the writer before writes are skipped
NICE = 19  # the writer's CPU priority: the lowest
CHUNK = 1 << 20  # state bytes written between looks at whether the engine is decoding
TRICKLE_S = 0.1  # while it is, one chunk per this long
_SAMPLE = 1 << 20  # bytes of the model file's head and tail that go into its id


def model_id(path: Path, layout: str) -> str:
    """A short stable id of a model file (size, first and last MiB) plus the KV layout."""
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(f"{size}:{layout}".encode())
    with path.open("rb") as f:
        h.update(f.read(_SAMPLE))
        f.seek(max(0, size - _SAMPLE))
        h.update(f.read(_SAMPLE))
    return h.hexdigest()[:24]


def key_name(cache_key: str) -> str:
    """The file name of a cache key (hashed: keys are ids chosen by callers)."""
    return hashlib.sha256(cache_key.encode()).hexdigest()[:40] + SUFFIX


ERASED = "erased"  # under kv_dir: the hashes of erased cache keys and scopes, one a line


def _key_mark(name: str) -> str:
    return "k" + name.removesuffix(SUFFIX)


def _scope_mark(scope: str) -> str:
    return "s" + hashlib.sha256(("scope\0" + scope).encode()).hexdigest()[:40]


class Erasures:
    """Cache keys and scopes (users, workspaces) erased by any process using this kv_dir:
    content-free hashes, appended, never removed (ids are never reused)."""

    def __init__(self, kv_dir: Path) -> None:
        self.path = kv_dir / ERASED
        self._seen: tuple[int, int] | None = None
        self._marks: frozenset[str] = frozenset()
        self._lock = threading.Lock()  # the decode thread and the writer thread both read

    def add(self, keys: Iterable[str] = (), scopes: Iterable[str] = ()) -> None:
        """Record erased cache keys and scopes (durably, before their files are deleted)."""
        lines = [_key_mark(key_name(k)) for k in keys] + [_scope_mark(s) for s in scopes]
        if not lines:
            return
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        data = ("\n".join(lines) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)

    def _current(self) -> frozenset[str]:
        try:
            st = self.path.stat()
        except OSError:
            return frozenset()
        seen = (st.st_mtime_ns, st.st_size)
        with self._lock:
            if seen != self._seen:
                try:
                    self._marks = frozenset(self.path.read_text(errors="replace").split())
                except OSError:
                    return self._marks
                self._seen = seen
            return self._marks

    def __bool__(self) -> bool:
        return bool(self._current())

    def stamp(self) -> tuple[int, int] | None:
        """Changes whenever an erasure is recorded (None: none ever was)."""
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def holds(self, name: str, scope: str | None) -> bool:
        """Whether a parked file (by its name, see `key_name`) of this scope was erased."""
        marks = self._current()
        if not marks:
            return False
        return _key_mark(name) in marks or (scope is not None and _scope_mark(scope) in marks)


@dataclass(frozen=True)
class DiskEntry:
    """What a parked file holds (its state bytes are read only when they are needed)."""

    tokens: list[int]
    scope: str | None
    public: int


def _read(path: Path, want_data: bool, states: StatePool) -> tuple[DiskEntry, State] | None:
    """The entry (and state bytes), or None if the file is missing, short or corrupt."""
    try:
        with path.open("rb") as f:
            layout = _HEAD if f.read(len(MAGIC)) == MAGIC else _CRC_HEAD
            f.seek(0)
            head = f.read(layout.size)
            if len(head) != layout.size:
                return None
            magic, n_meta, n_tok, n_data, check = layout.unpack(head)
            if (
                magic not in (MAGIC, _CRC_MAGIC)
                or os.fstat(f.fileno()).st_size != layout.size + n_meta + 4 * n_tok + n_data
            ):
                return None
            meta, toks = f.read(n_meta), f.read(4 * n_tok)
            data = read_state(f, n_data, states) if want_data else b""  # see kv/state.py
    except OSError:
        return None
    if data is None:
        return None
    if want_data and _checksum(layout, meta, toks, data) != check:
        return None
    try:
        m = json.loads(meta)
        tokens = array("i")
        tokens.frombytes(toks)
        return DiskEntry(tokens.tolist(), m.get("scope"), int(m.get("public", 0))), data
    except (ValueError, TypeError, AttributeError):
        return None


def _checksum(layout: struct.Struct, meta: bytes, toks: bytes, data: State) -> int:
    """What a file of this header layout stores of its meta, tokens and state."""
    if layout is _CRC_HEAD:
        return zlib.crc32(data, zlib.crc32(toks, zlib.crc32(meta)))
    h = xxhash.xxh3_64(meta)
    h.update(toks)
    h.update(data)
    return h.intdigest()


@dataclass
class _Writing:
    """A park on its way to the disk: its entry, and its state until the file holds it."""

    entry: DiskEntry
    data: State | None


class DiskStore:
    """Parked KV files of one model in one directory, size-capped, written in the background."""

    def __init__(
        self,
        root: Path,
        cap_bytes: int,
        pending_cap: int = PENDING_CAP,
        states: StatePool | None = None,
    ) -> None:
        self.root = root
        self.states = states or StatePool()  # the memory states are read into (kv/state.py)
        self.cap_bytes = cap_bytes
        self.pending_cap = pending_cap
        self.pending = 0  # bytes of state queued and not yet written
        self.skipped = 0  # writes skipped because pending_cap was reached
        self._quiet = threading.Event()  # set while the engine is not decoding
        self._quiet.set()
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.erased = Erasures(root.parent)
        self._sizes: dict[str, int] = {}
        # Writes queued or under way, by file name: a follow-up that comes while its prefix
        # is being parked reads the state still in memory (or the written temporary file).
        self._writing: dict[str, _Writing] = {}
        self._lock = threading.Lock()  # _sizes, _writing: the writer and the decode thread
        for p in root.iterdir():
            if p.name.endswith(".tmp"):  # a write that a crash interrupted
                p.unlink(missing_ok=True)
            elif p.suffix == SUFFIX:
                self._sizes[p.name] = p.stat().st_size
        if self.erased:  # a write that crossed an erasure in another process
            for name in list(self._sizes):
                if self._was_erased(name):
                    self._drop(name)
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="chatbox-kvdisk", daemon=True)
        self._thread.start()

    @property
    def size(self) -> int:
        with self._lock:
            return sum(self._sizes.values())

    def __contains__(self, cache_key: str) -> bool:
        with self._lock:
            return key_name(cache_key) in self._sizes

    # -- the decode thread ---------------------------------------------------------------
    def peek(self, cache_key: str) -> DiskEntry | None:
        """The parked tokens and scope of a key, without reading its state."""
        name = key_name(cache_key)
        with self._lock:
            if name not in self._sizes:
                return None
        got = _read(self.root / name, False, self.states)
        if got is None:
            self._drop(name)
        return got[0] if got else None

    def load(self, cache_key: str) -> tuple[DiskEntry, State] | None:
        """The entry and its verified state bytes; a bad file is deleted and None returned."""
        name = key_name(cache_key)
        got = _read(self.root / name, True, self.states)
        if got is None:
            log.warning("ignoring a damaged parked KV file %s", name)
            self._drop(name)
            return None
        with contextlib.suppress(OSError):
            os.utime(self.root / name)  # recently used: last to be evicted
        return got

    def better(
        self, key: str, scope: str | None, prompt: Sequence[int], best_n: int
    ) -> Parked | None:
        """The prefix parked under key (another scope's never), read only if more of the
        prompt than best_n tokens is in it; a park still being written is read as well."""
        name = key_name(key)
        with self._lock:
            writing = self._writing.get(name)
        if writing is not None:
            return self._unwritten(key, name, writing, scope, prompt, best_n)
        if key not in self:
            return None
        head = self.peek(key)
        if head is None or head.scope != scope:
            return None
        if min(common_prefix(head.tokens, prompt), len(prompt) - 1) <= best_n:
            return None
        got = self.load(key)
        if got is None or got[0].scope != scope:
            return None
        entry, data = got
        return Parked(key, entry.tokens, data, entry.scope, entry.public)

    def _unwritten(
        self,
        key: str,
        name: str,
        writing: _Writing,
        scope: str | None,
        prompt: Sequence[int],
        best_n: int,
    ) -> Parked | None:
        """A park queued or being written: its state from memory, else from the complete
        temporary file (its bytes are written, the rename is still to come)."""
        entry = writing.entry
        if entry.scope != scope or self.erased.holds(name, entry.scope):
            return None
        if min(common_prefix(entry.tokens, prompt), len(prompt) - 1) <= best_n:
            return None
        data = writing.data
        if data is None:
            got = _read(self.root / (name + ".tmp"), True, self.states)
            if got is None:  # renamed meanwhile: the file itself
                got = self.load(key) if key in self else None
            if got is None or got[0].scope != scope:
                return None
            entry, data = got
        return Parked(key, entry.tokens, data, entry.scope, entry.public)

    def decoding(self, busy: bool) -> None:
        """Whether the engine decodes (the scheduler says after every step): writes trickle
        while it does."""
        if busy == self._quiet.is_set():  # a change (an Event's set and clear take a lock)
            if busy:
                self._quiet.clear()
            else:
                self._quiet.set()

    def save(self, cache_key: str, entry: DiskEntry, data: State) -> bool:
        """Queue a write (replacing the key's file); returns at once, False when the write
        is skipped. An erased key's or scope's is never written."""
        if self.cap_bytes <= 0 or len(data) > self.cap_bytes:
            return False
        if self.erased.holds(key_name(cache_key), entry.scope):
            return False
        size = len(data)
        with self._lock:
            if self.pending + size > self.pending_cap:
                self.skipped += 1
                log.debug("parked KV writes are behind: not writing %s", key_name(cache_key))
                return False
            self.pending += size
        # The write takes the state out of this list, and lets go of it once its bytes are
        # in the file (before the fsync): the next save can reuse its memory.
        held = [data]
        name = key_name(cache_key)
        writing = _Writing(entry, data)
        with self._lock:
            self._writing[name] = writing

        def write() -> None:
            try:
                self._write(name, entry, held, writing)
            finally:
                with self._lock:
                    self.pending -= size
                    if self._writing.get(name) is writing:
                        del self._writing[name]

        self._queue.put(write)
        return True

    def forget(self, cache_key: str) -> threading.Event:
        """Queue the deletion of a key's file, after any write already queued; set when done."""
        done = threading.Event()
        with self._lock:
            self._writing.pop(key_name(cache_key), None)

        def drop() -> None:
            self._drop(key_name(cache_key))
            done.set()

        self._queue.put(drop)
        return done

    def forget_scope(self, scope: str) -> threading.Event:
        """Queue the deletion of every file of this scope (after queued writes); set when done."""
        done = threading.Event()
        with self._lock:
            for name in [n for n, w in self._writing.items() if w.entry.scope == scope]:
                del self._writing[name]

        def drop() -> None:
            with self._lock:
                names = list(self._sizes)
            for name in names:
                if _scope_of(self.root / name, self.states) == scope:
                    self._drop(name)
            done.set()

        self._queue.put(drop)
        return done

    def clear(self) -> threading.Event:
        """Queue the deletion of every file of this model; set when done."""
        done = threading.Event()
        with self._lock:
            self._writing.clear()

        def drop_all() -> None:
            with self._lock:
                names = list(self._sizes)
            for name in names:
                self._drop(name)
            done.set()

        self._queue.put(drop_all)
        return done

    def close(self) -> None:
        """Finish queued writes and stop the writer."""
        if self._thread.is_alive():
            self._quiet.set()  # nothing decodes any more: write the rest at full speed
            self._queue.put(None)
            self._thread.join()

    # -- the writer thread ---------------------------------------------------------------
    def _run(self) -> None:
        with contextlib.suppress(AttributeError, OSError):  # Linux: nice is per thread
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
        while (job := self._queue.get()) is not None:
            try:
                job()
            except Exception:  # a full disk must not stop later deletes
                log.exception("parked KV disk operation failed")

    def _write(self, name: str, entry: DiskEntry, held: list[State], writing: _Writing) -> None:
        final = self.root / name
        tmp = self.root / (name + ".tmp")
        meta = json.dumps({"scope": entry.scope, "public": entry.public}).encode()
        toks = array("i", entry.tokens).tobytes()
        size = len(held[0])
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_HEAD.pack(MAGIC, 0, 0, 0, 0))  # the real header once the checksum is known
                f.write(meta)
                f.write(toks)
                check = xxhash.xxh3_64(meta)
                check.update(toks)
                self._write_state(f, held.pop(), check)
                f.seek(0)
                f.write(_HEAD.pack(MAGIC, len(meta), len(entry.tokens), size, check.intdigest()))
                f.flush()
                writing.data = None  # the file holds it now: its memory may be reused
                self._quiet.wait(TRICKLE_S)
                os.fsync(f.fileno())
            if self.erased.holds(name, entry.scope):  # erased while it was queued
                tmp.unlink(missing_ok=True)
                return
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        with self._lock:
            self._sizes[name] = _HEAD.size + len(meta) + len(toks) + size
        if self.erased.holds(name, entry.scope):  # erased between the check and the rename
            self._drop(name)
            return
        self._evict(keep=name)

    def _write_state(self, f: io.BufferedWriter, data: State, check: xxhash.xxh3_64) -> None:
        """Write the state in CHUNK pieces (trickling while the engine decodes), carrying the
        checksum on. Every reference to the state ends with this call."""
        view = memoryview(data)
        for at in range(0, len(view), CHUNK):
            self._quiet.wait(TRICKLE_S)
            piece = view[at : at + CHUNK]
            check.update(piece)
            f.write(piece)

    def _was_erased(self, name: str) -> bool:
        if self.erased.holds(name, None):
            return True
        scope = _scope_of(self.root / name, self.states)
        return scope is not None and self.erased.holds(name, scope)

    def _evict(self, keep: str) -> None:
        with self._lock:
            total = sum(self._sizes.values())
            if total <= self.cap_bytes:
                return
            names = list(self._sizes)

        def mtime(n: str) -> float:
            try:
                return (self.root / n).stat().st_mtime
            except OSError:
                return 0.0

        for name in sorted((n for n in names if n != keep), key=mtime):
            if total <= self.cap_bytes:
                break
            with self._lock:
                total -= self._sizes.get(name, 0)
            self._drop(name)

    def _drop(self, name: str) -> None:
        (self.root / name).unlink(missing_ok=True)
        with self._lock:
            self._sizes.pop(name, None)


def open_store(
    settings: EngineSettings, model_path: Path, states: StatePool | None = None
) -> DiskStore | None:
    """The disk tier for a model under these settings, as the engine decided them
    (`tuning.attention`); None: off, or the disk is unusable."""
    if settings.kv_dir is None or settings.park_disk_bytes <= 0:
        return None
    # flash attention changes the V layout of the saved state
    layout = f"{settings.kv_type}:{'fa' if settings.flash_attn else 'nofa'}"
    try:
        root = settings.kv_dir / model_id(model_path, layout)
        return DiskStore(root, settings.park_disk_bytes, states=states)
    except OSError as exc:
        log.warning("parking KV on disk is off: %s", exc)
        return None


def forget_everywhere(kv_dir: Path, cache_key: str) -> int:
    """Delete a key's parked files of every model under kv_dir (models not loaded now)."""
    n = 0
    if not kv_dir.is_dir():
        return 0
    name = key_name(cache_key)
    for model_dir in kv_dir.iterdir():
        if not model_dir.is_dir():
            continue
        path = model_dir / name
        if path.exists():
            path.unlink(missing_ok=True)
            n += 1
    return n


def parked_tokens(path: Path) -> list[int] | None:
    """The token ids a parked file holds (None: not a readable parked file): its content,
    as the model's tokenizer turns them back into the prompt's text (audits, tests)."""
    got = _read(path, False, StatePool())
    return got[0].tokens if got else None


def _scope_of(path: Path, states: StatePool) -> str | None:
    """The scope a parked file was written for (None: none, or an unreadable file)."""
    got = _read(path, False, states)
    return got[0].scope if got else None


def forget_scope_everywhere(kv_dir: Path, scope: str) -> int:
    """Delete every parked file of a scope, of every model under kv_dir."""
    n = 0
    if not kv_dir.is_dir():
        return 0
    states = StatePool()
    for model_dir in kv_dir.iterdir():
        if not model_dir.is_dir():
            continue
        for path in model_dir.glob("*" + SUFFIX):
            if _scope_of(path, states) == scope:
                path.unlink(missing_ok=True)
                n += 1
    return n


def erase_files(kv_dir: Path, keys: Iterable[str] = (), scopes: Iterable[str] = ()) -> int:
    """Erase cache keys and scopes on disk, for this and every other process using kv_dir:
    record them (`Erasures`), then delete their parked files; returns how many went."""
    keys, scopes = list(keys), list(scopes)
    Erasures(kv_dir).add(keys, scopes)
    n = sum(forget_everywhere(kv_dir, k) for k in keys)
    return n + sum(forget_scope_everywhere(kv_dir, s) for s in scopes)
