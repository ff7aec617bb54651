"""Retention: each tier keeps a conversation `retention_days` after its last activity (an
imported one at least that long after its import), and a stored Responses API answer that
long after it was made; the sweeper erases the ones past that (and finishes any deletion
left half done, but not an import still being written)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from chatbox.accounts.audit import SYSTEM, Actor, AuditLog
from chatbox.chat.policy import Policy
from chatbox.store import User
from chatbox.store.erasure import Erased, ErasureRepo, Idle
from chatbox.store.jobs import JobRepo
from chatbox.store.responses import ResponseRepo
from chatbox.store.transfer import TransferRepo

SWEEP_JOB = "retention-sweep"
log = logging.getLogger("chatbox.data")
DAY_S = 86_400.0
IMPORT_LEASE_S = 3_600.0  # a hidden import this young is still being written, not a crash's
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
            f"Conversations are erased {t.retention_days} days after their last message "
            "(an imported one no sooner than that after its import); "
            "you can delete any of them sooner."
        )
    return "Conversations are kept until you delete them."


class Retention:
    """What retention erases now (`plan`), and erasing it (`run`)."""

    def __init__(
        self,
        erasure: ErasureRepo,
        policy: Policy,
        erase: Erase,
        audit: AuditLog,
        clock: Clock = time.time,
    ) -> None:
        self.erasure = erasure
        self.transfer = TransferRepo(erasure.db)
        self.responses = ResponseRepo(erasure.db)
        self.policy = policy
        self.erase = erase
        self.audit = audit
        self.clock = clock

    async def plan(self) -> list[Expired]:
        now = self.clock()
        out = []
        for tier in await self.erasure.tiers_in_use():
            days = self.policy.tier(tier).retention_days
            if days > 0:
                cutoff = now - days * DAY_S
                idle = await self.erasure.idle(tier, cutoff)
                fresh = await self.transfer.imported_after([c.id for c in idle], cutoff)
                out += [Expired(c, tier, days) for c in idle if c.id not in fresh]
        return out

    async def run(
        self, dry_run: bool = False, actor: Actor | User | None = None
    ) -> RetentionReport:
        """Erase what `plan` lists (and finish deletions left half done). A run an admin
        asked for (`actor`) is audit-logged, dry or not; the sweeper's only when it erased."""
        report = await self._run(dry_run)
        if actor is not None or report.erased.conversations:
            await self.audit.record(
                actor or SYSTEM,
                "retention.run",
                None,
                dry_run=dry_run,
                expired=len(report.expired),
                unfinished=report.unfinished,
                conversations=report.erased.conversations,
                turns=report.erased.turns,
            )
        return report

    async def _run(self, dry_run: bool) -> RetentionReport:
        report = RetentionReport(await self.plan(), dry_run=dry_run)
        writing = await self.transfer.being_imported(self.clock() - IMPORT_LEASE_S)
        pending = [p for p in await self.erasure.pending() if p[1] not in writing]
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
        responses = await self._expire_responses()
        if responses:
            log.info("retention deleted %d stored API response(s)", responses)
        if report.erased.conversations:
            log.info(
                "retention erased %d conversation(s) (%d turns)",
                report.erased.conversations,
                report.erased.turns,
            )
        return report

    async def _expire_responses(self) -> int:
        """Delete the stored Responses API answers past their tier's retention."""
        now, count = self.clock(), 0
        for tier in await self.erasure.tiers_in_use():
            days = self.policy.tier(tier).retention_days
            if days > 0:
                count += await self.responses.expire(tier, now - days * DAY_S)
        return count


class Sweeper:
    """Runs retention every `every_s` seconds in the background (first run soon after start);
    of several fronts on one database, the one that claims a period's sweep runs it."""

    def __init__(self, retention: Retention, every_s: float, jobs: JobRepo | None = None) -> None:
        self.retention = retention
        self.every_s = every_s
        self.jobs = jobs
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
                # Held, not let go: the other fronts skip their sweeps until the next period.
                if self.jobs is None or await self.jobs.claim(SWEEP_JOB, self.every_s * 0.9):
                    await self.retention.run()
            except Exception:  # one failed sweep must not end the sweeping
                log.exception("the retention sweep failed; it will run again")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
