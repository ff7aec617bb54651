"""Retention: each tier keeps a conversation `retention_days` after its last activity; the
sweeper erases the ones past that (and finishes any deletion left half done)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from chatbox.chat.policy import Policy
from chatbox.store.erasure import Erased, ErasureRepo, Idle

log = logging.getLogger("chatbox.data")
DAY_S = 86_400.0
Clock = Callable[[], float]
Erase = Callable[[str, Sequence[str]], Awaitable[Erased]]  # (user id, conversation ids)


@dataclass(frozen=True)
class Expired:
    conversation: Idle
    tier: str
    days: int


@dataclass
class RetentionReport:
    expired: list[Expired] = field(default_factory=list)  # past their tier's retention
    unfinished: int = 0  # deleted earlier but not yet erased (finished now)
    erased: Erased = field(default_factory=Erased)
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "expired": [
                {
                    "conversation_id": e.conversation.id,
                    "user": e.conversation.user_name,
                    "tier": e.tier,
                    "retention_days": e.days,
                    "last_active": e.conversation.updated_at,
                }
                for e in self.expired
            ],
            "unfinished_deletions": self.unfinished,
            "erased": {
                "conversations": self.erased.conversations,
                "turns": self.erased.turns,
                "documents": self.erased.documents,
                "memories": self.erased.memories,
            },
        }


NOTHING = "Nothing: chats are temporary and no content is stored."


def keeps(policy: Policy, tier: str) -> str:
    """What a tier keeps, in words, for the UI and the CLI."""
    t = policy.tier(tier)
    if t.zero_retention:
        return NOTHING
    if t.retention_days > 0:
        return (
            f"Conversations are erased {t.retention_days} days after their last message; "
            "you can delete any of them sooner."
        )
    return "Conversations are kept until you delete them."


class Retention:
    """What retention erases now (`plan`), and erasing it (`run`)."""

    def __init__(
        self, erasure: ErasureRepo, policy: Policy, erase: Erase, clock: Clock = time.time
    ) -> None:
        self.erasure = erasure
        self.policy = policy
        self.erase = erase
        self.clock = clock

    async def plan(self) -> list[Expired]:
        now = self.clock()
        out = []
        for tier in await self.erasure.tiers_in_use():
            days = self.policy.tier(tier).retention_days
            if days > 0:
                idle = await self.erasure.idle(tier, now - days * DAY_S)
                out += [Expired(c, tier, days) for c in idle]
        return out

    async def run(self, dry_run: bool = False) -> RetentionReport:
        report = RetentionReport(await self.plan(), dry_run=dry_run)
        pending = await self.erasure.pending()
        report.unfinished = len(pending)
        if dry_run:
            return report
        by_user: dict[str, list[str]] = {}
        for user_id, conv_id in pending:
            by_user.setdefault(user_id, []).append(conv_id)
        for e in report.expired:
            by_user.setdefault(e.conversation.user_id, []).append(e.conversation.id)
        for user_id, ids in by_user.items():
            report.erased.add(await self.erase(user_id, ids))
        if report.erased.conversations:
            log.info(
                "retention erased %d conversation(s) (%d turns)",
                report.erased.conversations,
                report.erased.turns,
            )
        return report


class Sweeper:
    """Runs retention every `every_s` seconds in the background (first run soon after start)."""

    def __init__(self, retention: Retention, every_s: float) -> None:
        self.retention = retention
        self.every_s = every_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.every_s > 0 and self._task is None:
            self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        delay = min(self.every_s, 5.0)  # soon after start: finish deletions a crash left
        while True:
            await asyncio.sleep(delay)
            delay = self.every_s
            try:
                await self.retention.run()
            except Exception:  # one failed sweep must not end the sweeping
                log.exception("the retention sweep failed; it will run again")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
