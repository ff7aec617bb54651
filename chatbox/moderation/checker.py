"""The moderator: the admin's rules, then profanity, then the category classifier, combined
under the policy into one verdict per text (allow, warn, flag or block, and why)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from chatbox.knowledge.embedder import (
    SCREEN_LAYERS,
    Embedder,
    EmbeddingUnavailable,
    default_model_path,
)
from chatbox.moderation.classifier import (
    SCREEN_FLOOR,
    SCREEN_THRESHOLD,
    TRAIN,
    CategoryModel,
    model_file,
    read_labelled,
    segments,
)
from chatbox.moderation.metrics import ModerationMetrics
from chatbox.moderation.policy import (
    PROFANITY,
    Action,
    ModerationPolicy,
    severity,
)
from chatbox.moderation.profanity import Profanity
from chatbox.moderation.verdicts import VerdictCache, verdict_key

log = logging.getLogger("chatbox.moderation")
# Checks a person waits on before anything else happens (the message, a fact to remember):
# they go ahead of answer windows and documents in the embedder (its urgent lane).
URGENT = frozenset({"input", "memory"})
INLINE_PIECES = 2  # texts this short get their profanity score on the event loop (~0.4 ms)
# Checks beside a stream: their vectors may stop half-way (Embedder.embed_screened), where a
# screen finds nothing in them; the API's scores and a person's message are always whole.
SCREENED = frozenset({"output"})

LABEL = {
    "harassment": "harassing",
    "hate": "hateful",
    "self-harm": "self-harm",
    "sexual": "sexual",
    "sexual/minors": "sexual content involving minors, which",
    "violence": "violent",
    "illicit": "illegal-activity",
    PROFANITY: "profane",
}
SUPPORT = (
    "It sounds like you may be going through something really painful, and I'm sorry. "
    "I can't help with this, but you don't have to face it alone. If you are in danger "
    "right now, call your local emergency number (112 in Europe, 911 in North America). "
    "You can talk to someone any time: in the US call or text 988 (Suicide & Crisis "
    "Lifeline); in the UK and Ireland call Samaritans on 116 123; elsewhere, "
    "https://findahelpline.com lists free, confidential lines in your country. "
    "Reaching out to someone you trust — a friend, family member or doctor — can help too."
)


def _what(category: str | None) -> str:
    if category is None or category not in LABEL:
        return "content this service's administrator has chosen to block"
    label = LABEL[category]
    return label if label.endswith("which") else f"{label} content, which"


@dataclass(frozen=True)
class Verdict:
    """One text's check: the strongest action, the category behind it, every score."""

    action: Action
    category: str | None
    scores: dict[str, float]
    triggered: dict[str, Action] = field(default_factory=dict)  # at or over threshold
    rule: str | None = None  # the admin rule that matched, if any
    elapsed_s: float = 0.0

    @property
    def blocked(self) -> bool:
        return self.action == "block"

    @property
    def flagged(self) -> bool:
        return bool(self.triggered)

    def refusal(self) -> str:
        """A clear, kind explanation of a refused message (support for self-harm)."""
        if self.category == "self-harm":
            return SUPPORT
        what = _what(self.category)
        if what.endswith("block"):
            return f"Your message wasn't sent: it contains {what}. Nothing was saved."
        return (
            f"Your message wasn't sent: it looks like {what} this service's policy doesn't "
            "allow. Nothing was saved; if this is a mistake, try rewording it."
        )

    def notice(self) -> str:
        """What replaces an answer that was cut."""
        if self.category == "self-harm":
            return "This answer was stopped. " + SUPPORT
        what = _what(self.category)
        if what.endswith("block"):
            return f"This answer was stopped: it began to include {what}."
        return f"This answer was stopped: it began to include {what} this service doesn't allow."

    def reason(self, name: str) -> str:
        """Why a document or fact was refused."""
        what = _what(self.category)
        if what.endswith("block"):
            return f"{name} was not added: it contains {what}."
        return f"{name} was not added: it contains {what} this service's policy doesn't allow."


ALLOW = Verdict("allow", None, {})


class Moderator:
    """Checks text under the policy; one per app, shared by chat, knowledge and the API."""

    def __init__(
        self,
        policy: ModerationPolicy,
        embedder: Embedder | None,
        cache_dir: Path,
        metrics: ModerationMetrics | None = None,
    ) -> None:
        self.policy = policy
        self.embedder = embedder
        self.cache_dir = cache_dir
        self.metrics = metrics
        self.profanity = Profanity(cache_dir)
        self.categories: CategoryModel | None = None
        self.screen: CategoryModel | None = None  # the categories on vectors at the cut
        self._ready: asyncio.Task[None] | None = None
        self.verdicts: VerdictCache[Verdict] = VerdictCache()  # in RAM, digests only
        # Scoped checks under way, by verdict key: the same text sent again meanwhile (a
        # history two calls send at once) waits for that check instead of scoring it twice.
        self._running: dict[bytes, tuple[asyncio.Task[Verdict], bool]] = {}  # (check, urgent)
        self._policy_digest: tuple[ModerationPolicy, str] | None = None

    @property
    def enabled(self) -> bool:
        return self.policy.enabled

    @property
    def version(self) -> str:
        """What a verdict depends on besides its text, tier and direction: the policy (its
        thresholds, actions and rules) and which classifiers are loaded. A cached verdict
        is only used under the version it was made with."""
        if self._policy_digest is None or self._policy_digest[0] is not self.policy:
            digest = hashlib.blake2b(repr(self.policy).encode(), digest_size=8).hexdigest()
            self._policy_digest = (self.policy, digest)
        loaded = (self.categories is not None, self.screen is not None, self.profanity.available)
        return self._policy_digest[1] + ":" + "".join("1" if x else "0" for x in loaded)

    def start(self) -> asyncio.Task[None]:
        """Load (or train, on first start) the classifiers in the background."""
        if self._ready is None:
            self._ready = asyncio.create_task(self._load())
        return self._ready

    async def _load(self) -> None:
        await asyncio.to_thread(self.profanity.scores, ["warm up"])
        if self.embedder is None:
            return
        try:
            path = self.embedder.model_path or default_model_path()
            file = model_file(self.cache_dir, path)
            # every lane, before the first message needs one; the int8 copy for answers too
            await self.embedder.load(approximate=True)
            self.categories = await self._trained(file, whole=True)
            if self.embedder.screens:
                kind, key = f"screen{SCREEN_LAYERS}", self.embedder.screen_key
                self.screen = await self._trained(
                    model_file(self.cache_dir, path, kind, key), whole=False
                )
        except EmbeddingUnavailable:
            log.warning("no embedding model: moderation runs without the category classifier")

    async def _trained(self, file: Path, whole: bool) -> CategoryModel:
        """The classifier cached in file, or trained now (on whole vectors, or at the cut)."""
        assert self.embedder is not None
        if file.exists():
            return await asyncio.to_thread(CategoryModel.load, file)
        rows = read_labelled(TRAIN)
        texts = [t for _, t in rows]
        if whole:
            vectors = await self.embedder.embed(texts)
        else:
            vectors, _ = await self.embedder.embed_screened(texts, keep=lambda v: False)
        model = await asyncio.to_thread(CategoryModel.train, vectors, [c for c, _ in rows])
        await asyncio.to_thread(model.save, file)
        log.info("moderation classifier (%s) trained on %d examples", file.stem, len(rows))
        return model

    async def scores(
        self, text: str, urgent: bool = False, screened: bool = False, reused: bool = True
    ) -> dict[str, float]:
        """Every layer's score for text (the rules are applied in `check`). `urgent`: a
        person is waiting (a message): its embedding goes in the embedder's urgent lane.
        `screened`: an answer window, whose vectors may stop at the cut (`screened_scores`).
        `reused=False`: an urgent text whose vector nothing reads again (a message on the
        OpenAI API): screened too, and what the screen keeps is scored on its exact vector."""
        await self.start()
        pieces = segments(text)
        # A short text's profanity score takes a fraction of a millisecond: cheaper here than
        # a thread hop, and one thread fewer competing for the cores with the embedding.
        p: list[float] | None = None
        threaded: asyncio.Task[list[float] | None] | None = None
        if len(pieces) <= INLINE_PIECES:
            p = self.profanity.scores(pieces)
        else:
            threaded = asyncio.create_task(asyncio.to_thread(self.profanity.scores, pieces))
        out: dict[str, float] = {}
        message = urgent and not reused
        if (screened or message) and self.screening:
            for row in await self.screened_scores(pieces, message):
                out = {c: max(out.get(c, 0.0), v) for c, v in row.items()}
        elif self.categories is not None and self.embedder is not None:
            out = self.categories.scores(await self._vectors(self.embedder, text, pieces, urgent))
        if threaded is not None:
            p = await threaded
        if p is not None:
            out[PROFANITY] = max(p)
        return out

    @property
    def screening(self) -> bool:
        """Whether answer windows are screened now: the split graph and both classifiers are
        loaded, and no category threshold is lower than the screen was checked for."""
        return (
            self.screen is not None
            and self.categories is not None
            and self.policy.lowest_threshold() >= SCREEN_FLOOR
        )

    def _keep(self, vector: np.ndarray) -> bool:
        assert self.screen is not None
        return self.screen.top(vector) >= SCREEN_THRESHOLD

    async def screened_scores(
        self, texts: list[str], message: bool = False
    ) -> list[dict[str, float]]:
        """Category scores of texts as answer windows get them: from the whole graph's
        vector where the screen found anything, else the screen's own (all under its
        threshold). `message`: as a message nothing reads again gets them (the urgent lane;
        the exact graph's vector where the screen found anything). Needs `screening`."""
        assert self.embedder is not None and self.categories is not None
        assert self.screen is not None
        vectors, whole = await self.embedder.embed_screened(texts, self._keep, message)
        return [
            (self.categories if w else self.screen).scores(v[None, :])
            for v, w in zip(vectors, whole, strict=True)
        ]

    @staticmethod
    async def _vectors(
        embedder: Embedder, text: str, pieces: list[str], urgent: bool
    ) -> np.ndarray:
        if not urgent:  # answer windows, documents, the API: never memoised, never first
            # and only scored, so the int8 graph may embed them (the classifier meets the
            # same held-out targets with its vectors: tests/moderation/test_layers.py)
            return await embedder.embed(pieces, approximate=True)
        # A message is embedded once: embed_one remembers the vector of the whole text (the
        # model reads its head, as retrieval does), and memory and document retrieval reuse
        # it. The rest of a long message is scored in pieces, in the same lane.
        if len(pieces) == 1:
            return (await embedder.embed_one(text))[None, :]
        head, rest = await asyncio.gather(
            embedder.embed_one(text), embedder.embed(pieces[1:], urgent=True)
        )
        return np.vstack([head[None, :], rest])

    def cached(self, text: str, tier: str, direction: str, scope: str) -> Verdict | None:
        """The verdict `check` gave text for `scope` under this policy, if it is remembered."""
        if not self.policy.enabled or not text.strip():
            return ALLOW
        if direction in SCREENED:
            return None
        verdict = self.verdicts.get(verdict_key(scope, self.version, tier, direction, text))
        if verdict is None:
            return None
        if self.metrics is not None:
            self.metrics.cached.labels(direction).inc()
        return replace(verdict, elapsed_s=0.0)  # remembered: it took no time now

    async def check(
        self,
        text: str,
        tier: str,
        direction: str,
        scope: str | None = None,
        urgent: bool | None = None,
        reused: bool = True,
    ) -> Verdict:
        """The policy's verdict on text for a user of `tier`, going `direction`.

        With a `scope` (the user it is checked for), a text already checked for that scope
        under the same policy is not scored again. Verdicts are not shared between users,
        though a verdict depends only on the text, tier and policy: a shared one would tell
        anyone, by how fast a text is answered, whether someone else had sent it. `urgent`
        overrides the direction's lane (a check nobody waits on yet goes in the background).
        `reused=False`: nothing reads the message's vector again (see `scores`)."""
        if not self.policy.enabled or not text.strip():
            return ALLOW
        if scope is None or direction in SCREENED:
            return await self._check(text, tier, direction, scope, urgent, reused)
        remembered = self.cached(text, tier, direction, scope)
        if remembered is not None:
            return remembered
        key = verdict_key(scope, self.version, tier, direction, text)
        lane = direction in URGENT if urgent is None else urgent
        running = self._running.get(key)
        if running is not None and lane and not running[1]:
            # A person waits on this one: it is not queued behind a background check.
            return await self._check(text, tier, direction, scope, urgent, reused)
        if running is None:
            task = asyncio.create_task(self._check(text, tier, direction, scope, urgent, reused))
            running = self._running[key] = (task, lane)
            task.add_done_callback(lambda t: self._checked(key, t))
        # Shielded: a caller that gives up (a cancelled request) leaves the check to the
        # others waiting on it, and its verdict to the cache.
        return await asyncio.shield(running[0])

    def _checked(self, key: bytes, task: asyncio.Task[Verdict]) -> None:
        if self._running.get(key, (None, False))[0] is task:
            del self._running[key]
        if not task.cancelled():
            task.exception()  # retrieved: every caller may have given up waiting

    async def _check(
        self,
        text: str,
        tier: str,
        direction: str,
        scope: str | None,
        urgent: bool | None,
        reused: bool = True,
    ) -> Verdict:
        """Score text and decide (no cache lookup); the verdict is remembered for scope."""
        started = time.perf_counter()
        screened = direction in SCREENED
        urgent = direction in URGENT if urgent is None else urgent
        scores = await self.scores(text, urgent, screened, reused)
        verdict = self.decide(scores, tier, direction, text)
        elapsed = time.perf_counter() - started
        verdict = Verdict(
            verdict.action,
            verdict.category,
            verdict.scores,
            verdict.triggered,
            verdict.rule,
            elapsed,
        )
        self._count(verdict, direction)
        if scope is not None and not screened:
            self.verdicts.put(verdict_key(scope, self.version, tier, direction, text), verdict)
        return verdict

    def decide(
        self, scores: dict[str, float], tier: str, direction: str, text: str = ""
    ) -> Verdict:
        """Scores and rules under the tier's thresholds and actions (no I/O)."""
        policy = self.policy.tier(tier)
        triggered: dict[str, Action] = {}
        for name, score in scores.items():
            if score >= policy.thresholds.get(name, 1.01):
                triggered[name] = policy.actions.get(name, "allow")
        by_rule: dict[str, str] = {}
        all_scores = dict(scores)
        for rule in self.policy.rules:
            if rule.applies(tier, direction) and rule.match(text):
                all_scores[rule.category] = 1.0
                if severity(rule.action) > severity(triggered.get(rule.category, "allow")):
                    triggered[rule.category] = rule.action
                    by_rule[rule.category] = rule.name
        if not triggered:
            return Verdict("allow", None, all_scores)
        # The strongest action decides; among equals, the highest score.
        category = max(triggered, key=lambda c: (severity(triggered[c]), all_scores.get(c, 0)))
        action = triggered[category]
        return Verdict(action, category, all_scores, triggered, by_rule.get(category))

    def _count(self, verdict: Verdict, direction: str) -> None:
        if self.metrics is None:
            return
        self.metrics.checks.labels(direction).inc()
        self.metrics.latency.labels(direction).observe(verdict.elapsed_s)
        for category, action in verdict.triggered.items():
            if action == "block":
                self.metrics.blocks.labels(direction, category).inc()
            elif action in ("warn", "flag"):
                self.metrics.flags.labels(direction, category, action).inc()

    def describe(self) -> dict[str, Any]:
        return {
            "enabled": self.policy.enabled,
            "categories": self.categories is not None,
            "screened_windows": self.screening,
            "profanity": self.profanity.available,
        }
