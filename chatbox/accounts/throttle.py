"""Failed-attempt counters: guessing passwords or API keys does not pay."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field

from chatbox.store.limits import Counters, MemoryCounters


class TooManyAttempts(Exception):
    """Too many recent failures for this account or address; retry after `retry_after` s."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"too many failed attempts; try again in {retry_after} s")
        self.retry_after = retry_after


@dataclass
class Attempts:
    """Failures per key (an account or an address) in a sliding window, counted in the
    store's counters (every front's on PostgreSQL) under `name`."""

    limit: int
    window_s: float
    name: str = "attempts"
    counters: Counters = field(default_factory=MemoryCounters)

    async def blocked_for(self, key: str) -> float:
        """Seconds until `key` may try again (0: now)."""
        return await self.counters.blocked_for(self.name, key, self.limit, self.window_s)

    async def fail(self, key: str) -> None:
        await self.counters.fail(self.name, key, self.window_s)

    async def clear(self, key: str) -> None:
        await self.counters.forget(self.name, key)


@dataclass
class LoginThrottle:
    """The failed-login and failed-key counters of one running app.

    Failures slow the attacker without denying the owner:
    - `pairs` (an account from one address) refuse that address for that account only, so
      guessing from one place stops while the owner, elsewhere, still logs in;
    - `accounts` (an account from anywhere) never refuse: past the limit each login to the
      account waits `slowdown_s` first, a right password included (`slow_down`);
    - `addresses` refuse an address spraying many accounts, or invalid API keys (a valid key
      is checked before this counter and never refused for it).
    """

    accounts: Attempts
    addresses: Attempts
    pairs: Attempts = field(default_factory=lambda: Attempts(5, 900.0, "pairs"))
    slowdown_s: float = 1.0

    @staticmethod
    def pair(account: str, address: str) -> str:
        return f"{account}\x00{address}"

    async def slow_down(self, account: str) -> None:
        """Wait a while before checking a password of an account under attack."""
        if self.slowdown_s > 0 and await self.accounts.blocked_for(account) > 0:
            await asyncio.sleep(self.slowdown_s)

    async def check(self, *keys: tuple[Attempts, str]) -> None:
        """Raise TooManyAttempts while any of these (counter, key) pairs is blocked."""
        wait = max([await a.blocked_for(k) for a, k in keys], default=0.0)
        if wait > 0:
            raise TooManyAttempts(max(1, math.ceil(wait)))
