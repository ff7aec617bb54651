"""Moderation for the rest of the appliance: check text, watch a stream, screen documents and
facts, keep the review queue. Built once per app (chatbox.services.server)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from chatbox.knowledge.embedder import Embedder
from chatbox.moderation.checker import ALLOW, Moderator, Verdict
from chatbox.moderation.classifier import SEGMENT_CHARS
from chatbox.moderation.metrics import ModerationMetrics
from chatbox.moderation.policy import ModerationPolicy, severity
from chatbox.moderation.queue import ReviewQueue
from chatbox.moderation.stream import OutputWatch
from chatbox.store import Store, User

log = logging.getLogger("chatbox.moderation")
# What of a new text is checked before the first token: one segment the classifier reads in
# one pass (~10 ms); the rest is checked beside generation and cuts the answer if it fails.
HEAD_CHARS = SEGMENT_CHARS
OVERLAP_CHARS = 200  # the rest starts this far before the head ends: a term across the cut


def parts(text: str) -> list[str]:
    """The texts a message is checked (and its verdicts remembered) as: itself, or a long
    one's head and the rest, overlapping; the same cut every time it is sent."""
    if len(text) <= HEAD_CHARS:
        return [text]
    return [text[:HEAD_CHARS], text[HEAD_CHARS - OVERLAP_CHARS :]]


def worse(a: Verdict, b: Verdict) -> Verdict:
    """The verdict with the stronger action (the first among equals)."""
    return b if severity(b.action) > severity(a.action) else a


@dataclass
class Screening:
    """A request's messages, checked: the verdict before any model work, and what was left
    for beside generation (`start_rest` checks it; nothing left: None)."""

    verdict: Verdict
    start_rest: Callable[[], asyncio.Task[Verdict]] | None = None


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

    def start(self) -> asyncio.Task[None] | None:
        """Load (or, on first start, train) the classifiers in the background."""
        return self.moderator.start() if self.enabled else None

    async def check(
        self, user: User, text: str, direction: str = "input", reused: bool = True
    ) -> Verdict:
        """The verdict on text for user (see `Moderator.check`; `reused=False`: nothing reads
        the message's vector again, so the screen reads it first)."""
        return await self.moderator.check(text, user.tier, direction, user.id, reused=reused)

    async def judge(self, user: User, text: str, direction: str = "output") -> Verdict:
        """The verdict on text that no one will read (a shadow answer): counted in no metric,
        remembered for no later check, queued for no review."""
        if not self.enabled or not text.strip():
            return ALLOW
        scores = await self.moderator.scores(text, urgent=False, screened=False)
        return self.moderator.decide(scores, user.tier, direction, text)

    async def screen_messages(
        self, user: User, texts: Sequence[str], direction: str = "input"
    ) -> Screening:
        """A request's messages (oldest first; an OpenAI client sends every earlier one
        again), each checked once per user: a remembered verdict is used as it is; of the
        new text, the newest message's head is checked now, so what this adds before the
        first token does not grow with the history or the message; everything else new is
        checked beside generation (`Screening.start_rest`, blocked verdicts queued).
        """
        tier, verdict = user.tier, ALLOW
        todo: list[str] = []
        for text in texts:
            for part in parts(text):
                known = self.moderator.cached(part, tier, direction, user.id)
                if known is None:
                    todo.append(part)
                else:
                    verdict = worse(verdict, known)
        if verdict.blocked:
            return Screening(verdict)
        newest = parts(texts[-1])[0] if texts else ""
        if newest in todo:
            todo.remove(newest)
            # Nothing on this path reads the message's vector again (no retrieval).
            verdict = worse(verdict, await self.check(user, newest, direction, reused=False))
            if verdict.blocked:
                return Screening(verdict)
        if not todo:
            return Screening(verdict)

        def start_rest() -> asyncio.Task[Verdict]:
            return asyncio.create_task(self._rest(user, todo[::-1], direction))

        return Screening(verdict, start_rest)

    async def _rest(self, user: User, texts: list[str], direction: str) -> Verdict:
        """Check texts one after another in the background lane (newest first); the first
        block ends it and is queued with its category and scores only."""
        verdict = ALLOW
        for text in texts:
            checked = await self.moderator.check(text, user.tier, direction, user.id, False)
            verdict = worse(verdict, checked)
            if verdict.blocked:
                await self.queue.record(user, direction, verdict, None)
                break
        return verdict

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
            verdict = await self.moderator.check(text, tier, direction, scope=user_id)
            if verdict.action != "allow" and (worst.action == "allow" or verdict.blocked):
                worst = verdict
            if verdict.blocked:
                break
        refuse = worst.blocked or (direction == "memory" and worst.action != "allow")
        if worst.action != "allow":
            await self.queue.record(user, direction, worst, None, source=name)
        return worst.reason(name) if refuse else None
