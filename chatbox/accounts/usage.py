"""Usage reports for admins: requests and tokens per user, model, day and arm; no content."""

from __future__ import annotations

from typing import Any

from chatbox.store import Store, UsageRow
from chatbox.store.usage import day_of

__all__ = ["day_of", "month_start", "usage_report"]


def month_start(now: float | None = None) -> str:
    """The first day of the month (YYYY-MM-01) that `now` (default: now) falls in."""
    return day_of(now)[:8] + "01"


def row_out(row: UsageRow) -> dict[str, Any]:
    return {
        "user": row.user,
        "model": row.model,
        "day": row.day,
        "arm": row.arm,
        "requests": row.requests,
        "prompt_tokens": row.prompt_tokens,
        "completion_tokens": row.completion_tokens,
        "cached_tokens": row.cached_tokens,
        "total_tokens": row.total_tokens,
        "shed": row.shed,
        "degraded": row.degraded,
    }


async def usage_report(store: Store, since: str | None, name: str | None) -> dict[str, Any]:
    """Rows per (user, model, day, arm) plus totals per user; never any content."""
    user_id = None
    if name:
        target = await store.users.get_by_name(name)
        if target is None:
            return {"since": since, "data": [], "users": []}
        user_id = target.id
    rows = await store.usage.report(since, user_id)
    totals: dict[str, dict[str, Any]] = {}
    users = {u.name: u for u in await store.users.list()}
    for row in rows:
        u = users.get(row.user)
        t = totals.setdefault(
            row.user,
            {
                "user": row.user,
                "tier": u.tier if u else None,
                "role": u.role if u else None,
                "disabled": u.disabled if u else None,
                "requests": 0,
                "total_tokens": 0,
                "shed": 0,
                "degraded": 0,
            },
        )
        t["requests"] += row.requests
        t["total_tokens"] += row.total_tokens
        t["shed"] += row.shed
        t["degraded"] += row.degraded
    return {"since": since, "data": [row_out(r) for r in rows], "users": list(totals.values())}
