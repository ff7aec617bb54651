"""argon2 in the test process, remembering its results.

A hash or a check costs about 0.25 s of CPU here, on purpose (64 MiB, 3 passes), and the suite
makes and checks the same few passwords thousands of times: every box seeds its admin and its
users, and every login checks one. The test process keeps the shipped hasher, parameters and
errors, and asks it once per password (to hash) and once per hash and password (to check).
Servers and CLI runs the tests start as processes hash as shipped."""

from __future__ import annotations

import threading
from typing import Literal

from argon2 import PasswordHasher
from argon2.exceptions import VerificationError


class RememberingHasher(PasswordHasher):
    """A PasswordHasher that hashes a password once and checks a (hash, password) pair once."""

    def __init__(self, shipped: PasswordHasher) -> None:
        super().__init__(
            time_cost=shipped.time_cost,
            memory_cost=shipped.memory_cost,
            parallelism=shipped.parallelism,
            hash_len=shipped.hash_len,
            salt_len=shipped.salt_len,
            type=shipped.type,
        )
        self._lock = threading.Lock()
        self._hashes: dict[str | bytes, str] = {}
        self._checks: dict[tuple[str | bytes, str | bytes], VerificationError | None] = {}

    def hash(self, password: str | bytes, *, salt: bytes | None = None) -> str:
        if salt is not None:
            return super().hash(password, salt=salt)
        with self._lock:
            made = self._hashes.get(password)
        if made is None:
            made = super().hash(password)
            with self._lock:
                made = self._hashes.setdefault(password, made)
        return made

    def verify(self, hash: str | bytes, password: str | bytes) -> Literal[True]:
        key = (hash, password)
        with self._lock:
            known = key in self._checks
            refused = self._checks.get(key)
        if not known:
            try:
                super().verify(hash, password)
                refused = None
            except VerificationError as exc:  # a mismatch; other errors (a bad hash) propagate
                refused = exc
            with self._lock:
                self._checks[key] = refused
        if refused is not None:
            raise type(refused)(*refused.args)
        return True


def remember_password_hashes() -> None:
    """Swap the store's hasher in this process for a remembering one with its parameters."""
    from chatbox.store import users

    if not isinstance(users._HASHER, RememberingHasher):
        users._HASHER = RememberingHasher(users._HASHER)
