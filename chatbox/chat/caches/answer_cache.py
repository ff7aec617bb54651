"""The exact-match answer cache: a deterministic OpenAI-API request (temperature 0 or a fixed
seed) sent again by the same user, to the same model file, under the same moderation rules,
gets the first answer's response body again without any model work.

What a key holds: the scope (the user's id, or `tier:<name>` for a tier the policy declares
public), the model's name and file identity, the moderation rules in force for the user's
tier, and the canonical JSON of every field of the request that shapes the answer (messages,
tools, tool_choice, response_format, every sampling parameter as resolved). The key is a
SHA-256 of that, so the cache holds no request text, only answers.

Entries live in this process's RAM (an LRU bounded by bytes, with a lifetime) and are
declared in the content registry as an artifact: an account's erasure drops what it wrote.
Whether a request may use the cache at all (zero retention, streaming, moderation) is the
chat service's to decide (`ChatService.complete_exact`)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chatbox.chat.options import TurnOptions
from chatbox.chat.policy import AnswerCachePolicy
from chatbox.engine.types import ModelInfo

# Request fields that do not shape the answer: how it is delivered, and OpenAI's end-user tag.
_NOT_IN_KEY = frozenset({"stream", "stream_options", "user", "model"})
_PIECE = 1 << 20  # the file identity reads the first and last MiB


def deterministic(options: TurnOptions) -> bool:
    """Greedy decoding or a fixed seed: the same request gives the same answer."""
    greedy = options.temperature is not None and options.temperature <= 0
    return greedy or options.seed is not None


def file_identity(path: str) -> str:
    """A model file's identity: its size and a hash of its first and last MiB (a whole-file
    hash of a multi-GiB GGUF would cost seconds); a path that is no local file (a remote
    engine's model) is its own identity."""
    try:
        size = os.path.getsize(path)
        digest = hashlib.sha256(str(size).encode())
        with open(path, "rb") as f:
            digest.update(f.read(_PIECE))
            f.seek(max(0, size - _PIECE))
            digest.update(f.read(_PIECE))
    except OSError:
        return "path:" + path
    return digest.hexdigest()[:32]


class Identities:
    """Model file identities, computed once per file version (path, size, mtime)."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, int, int], str] = {}

    async def of(self, info: ModelInfo) -> str:
        try:
            st = Path(info.path).stat()
            version = (info.path, st.st_size, st.st_mtime_ns)
        except OSError:
            version = (info.path, -1, -1)
        known = self._known.get(version)
        if known is None:
            known = await asyncio.to_thread(file_identity, info.path)
            self._known[version] = known
        return f"{info.name}:{info.architecture}:{known}"


def request_key(
    scope: str,
    model: str,
    identity: str,
    moderation: str,
    request: Mapping[str, Any],
    options: TurnOptions,
    max_tokens: int,
) -> str:
    """The cache key of one request (see the module's docstring for what it holds)."""
    fields = {k: v for k, v in request.items() if k not in _NOT_IN_KEY and v is not None}
    resolved = repr(options.sampling(max_tokens)) + repr(options.tools) + str(options.n)
    canonical = json.dumps(
        [scope, model, identity, moderation, fields, resolved],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=repr,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class CachedAnswer:
    """One kept answer: the response body exactly as first sent, and what it used."""

    owner: str  # the user whose request it answered (erasing their account drops it)
    body: bytes
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    stored_at: float


class AnswerCache:
    """Answers by key in RAM: an LRU bounded by `max_bytes`, each kept `ttl_s` at most."""

    def __init__(self, policy: AnswerCachePolicy, clock: Callable[[], float] = time.monotonic):
        self.policy = policy
        self.clock = clock
        self.identities = Identities()
        self._entries: OrderedDict[str, CachedAnswer] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0
        self.on_lookup: Callable[[str], None] = lambda outcome: None  # metrics: hit, miss
        self.on_size: Callable[[int, int], None] = lambda entries, size: None  # metrics

    @property
    def size(self) -> int:
        """The bytes its answers (and keys) take."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> CachedAnswer | None:
        """The answer kept under `key` (counted as a hit or a miss)."""
        entry = self._entries.get(key)
        if entry is not None and self.clock() - entry.stored_at > self.policy.ttl_s:
            self._drop(key)
            self.on_size(len(self._entries), self._bytes)
            entry = None
        if entry is None:
            self.misses += 1
            self.on_lookup("miss")
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        self.on_lookup("hit")
        return entry

    def put(self, key: str, owner: str, body: bytes, usage: tuple[int, int, int]) -> bool:
        """Keep an answer; False when it alone would take more than an eighth of the cache."""
        size = len(body) + len(key)
        if size > self.policy.max_bytes // 8:
            return False
        if key in self._entries:
            self._drop(key)
        self._entries[key] = CachedAnswer(owner, body, *usage, stored_at=self.clock())
        self._bytes += size
        while self._bytes > self.policy.max_bytes and self._entries:
            self._drop(next(iter(self._entries)))
        self.on_size(len(self._entries), self._bytes)
        return True

    def forget_owner(self, user_id: str) -> int:
        """Drop every answer the user's requests wrote (an erased account); how many."""
        keys = [k for k, e in self._entries.items() if e.owner == user_id]
        for key in keys:
            self._drop(key)
        self.on_size(len(self._entries), self._bytes)
        return len(keys)

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0
        self.on_size(0, 0)

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key)
        self._bytes -= len(entry.body) + len(key)
