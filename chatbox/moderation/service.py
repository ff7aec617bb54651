"""Moderation for the rest of the appliance: check text, watch a stream, screen documents and
facts, keep the review queue. Built once per app (chatbox.services)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry

from chatbox.knowledge.embedder import Embedder
from chatbox.moderation.checker import ALLOW, Moderator, Verdict
from chatbox.moderation.metrics import ModerationMetrics
from chatbox.moderation.policy import ModerationPolicy
from chatbox.moderation.queue import ReviewQueue
from chatbox.moderation.stream import OutputWatch
from chatbox.store import Store, User


class ModerationService:
    def __init__(
        self,
        store: Store,
        policy: ModerationPolicy,
        embedder: Embedder | None,
        cache_dir: Path,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.store = store
        self.policy = policy
        self.moderator = Moderator(policy, embedder, cache_dir, ModerationMetrics(registry))
        self.queue = ReviewQueue(store, policy)

    @property
    def enabled(self) -> bool:
        return self.policy.enabled

    def start(self) -> None:
        """Load (or, on first start, train) the classifiers in the background."""
        if self.enabled:
            self.moderator.start()

    async def check(self, user: User, text: str, direction: str = "input") -> Verdict:
        return await self.moderator.check(text, user.tier, direction)

    def watch(self, user: User, on_block: Callable[[Verdict], None]) -> OutputWatch | None:
        """A watch over one answer's stream, or None where output moderation is off."""
        if not (self.policy.enabled and self.policy.output):
            return None

        async def check(text: str) -> Verdict:
            return await self.moderator.check(text, user.tier, "output")

        return OutputWatch(check, self.policy.window_tokens, self.policy.stride_tokens, on_block)

    async def record_output(
        self,
        user: User,
        watch: OutputWatch,
        conversation_id: str | None = None,
        turn_id: str | None = None,
    ) -> Verdict:
        """Queue what a finished watch saw (the block, else the strongest flag)."""
        verdict = watch.verdict or watch.mark or ALLOW
        await self.queue.record(
            user,
            "output",
            verdict,
            watch.text,
            conversation_id=conversation_id,
            turn_id=turn_id,
        )
        return verdict

    async def screen(
        self, user_id: str, texts: Sequence[str], direction: str, name: str
    ) -> str | None:
        """A document's text (or facts to remember): the refusal reason, or None to go on.

        A document is refused on a block; a fact on anything but allow (facts come back in
        every later conversation, so a flagged one is not kept)."""
        if not self.enabled:
            return None
        user = await self.store.users.get(user_id)
        tier = user.tier if user else "free"
        worst = ALLOW
        for text in texts:
            verdict = await self.moderator.check(text, tier, direction)
            if verdict.action != "allow" and (worst.action == "allow" or verdict.blocked):
                worst = verdict
            if verdict.blocked:
                break
        refuse = worst.blocked or (direction == "memory" and worst.action != "allow")
        if worst.action != "allow":
            await self.queue.record(user, direction, worst, None, source=name)
        return worst.reason(name) if refuse else None
