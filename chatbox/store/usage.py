"""Usage accounting: requests and tokens per user, model, day and experiment arm."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from chatbox.store.db import Database

log = logging.getLogger("chatbox.store")


def day_of(ts: float | None = None) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(time.time() if ts is None else ts))


def hour_of(ts: float | None = None) -> int:
    """The hour's number since 1970 (UTC) that `ts` (default now) falls in."""
    return int((time.time() if ts is None else ts) // 3600)


async def count_usage(
    tx: Any,
    user_id: str,
    model: str,
    prompt: int = 0,
    completion: int = 0,
    cached: int = 0,
    requests: int = 1,
    shed: int = 0,
    degraded: int = 0,
    arm: str = "",
    ts: float | None = None,
) -> None:
    """Add one request's counts in the caller's transaction (`UsageRepo.record`'s, or the
    recovery of an answer whose front died)."""
    await tx.execute(
        "INSERT INTO usage (user_id, model, day, arm, requests, prompt_tokens,"
        " completion_tokens, cached_tokens, shed, degraded)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (user_id, model, day, arm) DO UPDATE SET"
        " requests = usage.requests + excluded.requests,"
        " prompt_tokens = usage.prompt_tokens + excluded.prompt_tokens,"
        " completion_tokens = usage.completion_tokens + excluded.completion_tokens,"
        " cached_tokens = usage.cached_tokens + excluded.cached_tokens,"
        " shed = usage.shed + excluded.shed, degraded = usage.degraded + excluded.degraded",
        (user_id, model, day_of(ts), arm, requests, prompt, completion, cached, shed, degraded),
    )
    # A request asked for this model (answered or not); a canary arm's share is an
    # experiment's, which must not become the model's weekly busy hours.
    if (requests or shed) and not arm:
        await tx.execute(
            "INSERT INTO usage_hours (model, hour, requests, tokens) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (model, hour) DO UPDATE SET"
            " requests = usage_hours.requests + excluded.requests,"
            " tokens = usage_hours.tokens + excluded.tokens",
            (model, hour_of(ts), requests + shed, prompt + completion),
        )


@dataclass(frozen=True)
class UsageRow:
    user: str  # the user's name
    model: str
    day: str
    arm: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    shed: int
    degraded: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def from_row(cls, row: Any) -> UsageRow:
        return cls(
            row["name"],
            row["model"],
            row["day"],
            row["arm"],
            row["requests"],
            row["prompt_tokens"],
            row["completion_tokens"],
            row["cached_tokens"],
            row["shed"],
            row["degraded"],
        )


class UsageRepo:
    """Usage counts; a write `record_soon` started is seen by every read of this repo."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._pending: set[asyncio.Task[None]] = set()

    def record_soon(self, user_id: str, model: str, **counts: Any) -> None:
        """`record`, without the caller waiting for the write (a cached answer's reply)."""
        task = asyncio.get_running_loop().create_task(self.record(user_id, model, **counts))
        self._pending.add(task)
        task.add_done_callback(self._written)

    def _written(self, task: asyncio.Task[None]) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a usage record was not written", exc_info=task.exception())

    async def settled(self) -> None:
        """Until every write `record_soon` started has ended."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    async def record(
        self,
        user_id: str,
        model: str,
        *,
        prompt: int = 0,
        completion: int = 0,
        cached: int = 0,
        requests: int = 1,
        shed: int = 0,
        degraded: int = 0,
        arm: str = "",
        ts: float | None = None,
    ) -> None:
        async with self.db.transaction() as tx:
            await count_usage(
                tx, user_id, model, prompt, completion, cached, requests, shed, degraded, arm, ts
            )

    async def hourly(self, since_hour: int) -> list[tuple[str, int, int, int]]:
        """(model, hour, requests, tokens) from `since_hour` (hours since 1970) on."""
        await self.settled()
        rows = await self.db.fetchall(
            "SELECT model, hour, requests, tokens FROM usage_hours WHERE hour >= ?"
            " ORDER BY hour, model",
            (since_hour,),
        )
        return [(r[0], int(r[1]), int(r[2]), int(r[3])) for r in rows]

    async def tokens_since(self, user_id: str, day: str) -> int:
        """Prompt plus completion tokens the user spent from `day` (YYYY-MM-DD) on (read
        from the last commit: admission of every request with a budget asks this)."""
        await self.settled()
        row = await self.db.snapshot.fetchone(
            "SELECT COALESCE(SUM(prompt_tokens + completion_tokens), 0) FROM usage"
            " WHERE user_id = ? AND day >= ?",
            (user_id, day),
        )
        return int(row[0])

    async def report(self, since: str | None = None, user_id: str | None = None) -> list[UsageRow]:
        """Usage rows (no content), newest day first."""
        await self.settled()
        sql = "SELECT u.name, g.* FROM usage g JOIN users u ON u.id = g.user_id WHERE g.day >= ?"
        params: list[Any] = [since or "0000-00-00"]
        if user_id is not None:
            sql += " AND g.user_id = ?"
            params.append(user_id)
        rows = await self.db.fetchall(sql + " ORDER BY g.day DESC, u.name, g.model", params)
        return [UsageRow.from_row(r) for r in rows]
