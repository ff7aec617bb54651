"""Failed-attempt counters: guessing passwords or API keys does not pay."""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field


class TooManyAttempts(Exception):
    """Too many recent failures for this account or address; retry after `retry_after` s."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"too many failed attempts; try again in {retry_after} s")
        self.retry_after = retry_after


@dataclass
class Attempts:
    """Failures per key (an account or an address) in a sliding window."""

    limit: int
    window_s: float
    _fails: dict[str, deque[float]] = field(default_factory=dict)

    def blocked_for(self, key: str, now: float | None = None) -> float:
        """Seconds until `key` may try again (0: now)."""
        now = time.monotonic() if now is None else now
        fails = self._fails.get(key)
        if not fails:
            return 0.0
        while fails and fails[0] <= now - self.window_s:
            fails.popleft()
        if not fails:
            del self._fails[key]
            return 0.0
        return fails[0] + self.window_s - now if len(fails) >= self.limit else 0.0

    def fail(self, key: str) -> None:
        if len(self._fails) > 100_000:  # bounded memory under a spray of addresses
            self._fails.clear()
        self._fails.setdefault(key, deque(maxlen=self.limit)).append(time.monotonic())

    def clear(self, key: str) -> None:
        self._fails.pop(key, None)


@dataclass
class LoginThrottle:
    """The failed-login and failed-key counters of one running app."""

    accounts: Attempts
    addresses: Attempts

    def check(self, *keys: tuple[Attempts, str]) -> None:
        """Raise TooManyAttempts while any of these (counter, key) pairs is blocked."""
        wait = max((a.blocked_for(k) for a, k in keys), default=0.0)
        if wait > 0:
            raise TooManyAttempts(max(1, math.ceil(wait)))
