"""Grading sampled live answers of a canary's tier: an answer to one of the canary's eval
suite prompts is scored by that case's check (its reference: exact, regex, JSON schema,
similarity, refusal, or the judge told the reference); any other answer by the judge model
the canary names. The text lives only in the grading task and the judge's request.

`graded` wraps a stateless answer (the OpenAI-compatible API) so that, once its last event
has been handed on, it is offered for grading as a conversation turn's answer is.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from chatbox.chat.policy import Canary
from chatbox.chat.rollout.evalsuite import (
    Answer,
    Case,
    Similarity,
    Suite,
    SuiteError,
    load_suite,
    score,
)
from chatbox.engine.types import ChatMessage, DoneEvent, EngineEvent, Generation, TokenEvent
from chatbox.store import User

log = logging.getLogger("chatbox.canary")
KeepsNothing = Callable[[User], Awaitable[bool]]
# Routes whose answers are a canary's arm or its tier's baseline (not a picked or pinned model).
SAMPLED_ROUTES = ("canary", "tier", "default")


class Sampler(Protocol):
    """What takes live answers for grading (chatbox.chat.rollout.canary.CanaryService)."""

    def grades_tier(self, tier: str) -> bool: ...

    def sample_live(self, user: User, arm: str, question: str, answer: str) -> None: ...


class Grade(Protocol):
    """The judge model's grade of an answer, 0..1 (rollout.evaluation.Evaluator.grade)."""

    def __call__(
        self, judge: str, question: str, answer: str, reference: str = "", rubric: str = ""
    ) -> Awaitable[float]: ...


def _key(text: str) -> str:
    """A prompt as it is matched: whitespace runs as one space, case folded."""
    return " ".join(text.split()).casefold()


@dataclass(frozen=True)
class References:
    """An eval suite's cases by their prompt (those a plain live answer can be scored on: no
    tool calls asked for)."""

    suite: Suite
    by_prompt: dict[str, Case]

    @classmethod
    def load(cls, path: Path) -> References:
        suite = load_suite(path)
        cases = {_key(c.prompt): c for c in suite.cases if not c.tools}
        return cls(suite, cases)

    def case_for(self, question: str) -> Case | None:
        return self.by_prompt.get(_key(question))


class LiveGrader:
    """Scores sampled live answers for the canaries that opted in."""

    def __init__(
        self,
        grade: Grade | None = None,
        similarity: Similarity | None = None,
        keeps_nothing: KeepsNothing | None = None,
    ) -> None:
        self.grade = grade
        self.similarity = similarity
        self.keeps_nothing = keeps_nothing
        self._references: dict[str, References] = {}

    def references(self, canary: Canary) -> References | None:
        """The canary's eval suite, read once; a SuiteError names the canary and the file."""
        if canary.eval_suite is None:
            return None
        found = self._references.get(canary.eval_suite)
        if found is None:
            try:
                found = References.load(Path(canary.eval_suite))
            except SuiteError as exc:
                raise SuiteError(f"canary {canary.arm}'s eval_suite: {exc}") from exc
            self._references[canary.eval_suite] = found
        return found

    def can_grade(self, canary: Canary) -> bool:
        """Whether answers of this canary's tier can be scored at all."""
        judged = canary.judge is not None and self.grade is not None
        return canary.eval_percent > 0 and (judged or canary.eval_suite is not None)

    async def score(self, canary: Canary, user: User, question: str, answer: str) -> float | None:
        """The answer's score 0..1, or None: a request that keeps nothing, or an answer
        neither a reference nor a judge can score."""
        if self.keeps_nothing is not None and await self.keeps_nothing(user):
            return None
        refs = self.references(canary)
        case = refs.case_for(question) if refs is not None else None
        judge_name = canary.judge or (refs.suite.judge if refs is not None else None)
        if case is not None:
            judge = None
            if judge_name is not None and self.grade is not None:
                grade, name = self.grade, judge_name

                async def judge(case: Case, text: str) -> float:
                    check = case.check
                    return await grade(name, case.prompt, text, check.reference, check.rubric)

            kind = case.check.kind
            if (kind == "similarity" and self.similarity is None) or (
                kind == "judge" and judge is None
            ):
                return None  # a grader the case needs is missing: no sample, not a zero
            return (await score(case, Answer(answer), self.similarity, judge)).score
        if canary.judge is None or self.grade is None:
            return None
        return await self.grade(canary.judge, question, answer)


class GradedGeneration:
    """A stateless answer offered to the canaries' live grading once its last event has been
    handed on (the caller has the whole answer before grading starts)."""

    def __init__(self, inner: Generation, canaries: Sampler, user: User, question: str) -> None:
        self.inner = inner
        self.canaries = canaries
        self.user = user
        self.question = question

    @property
    def ticket(self) -> Any:  # the admission ticket (route headers), where metered
        return getattr(self.inner, "ticket", None)

    def __aiter__(self) -> AsyncIterator[EngineEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[EngineEvent]:
        parts: list[str] = []
        done: DoneEvent | None = None
        async for event in self.inner:
            if isinstance(event, TokenEvent):
                parts.append(event.text)
            elif isinstance(event, DoneEvent):
                done = event
            yield event
        route = getattr(self.ticket, "route", None)
        if done is None or done.finish_reason not in ("stop", "length") or route is None:
            return
        if route.reason in SAMPLED_ROUTES:
            self.canaries.sample_live(self.user, route.arm, self.question, "".join(parts))

    def cancel(self) -> None:
        self.inner.cancel()


def graded(
    generation: Generation,
    canaries: Sampler | None,
    user: User | None,
    messages: tuple[ChatMessage, ...],
    plain: bool,
    zero_retention: bool,
) -> Generation:
    """`generation`, offered to live grading when done, if it can be: a user's single plain
    answer to chat messages ending in a question, in a tier whose canary grades answers, of
    a request that keeps its data."""
    if canaries is None or user is None or not plain or zero_retention or not messages:
        return generation
    last = messages[-1]
    if last.role != "user" or not isinstance(last.content, str) or not last.content.strip():
        return generation
    if not canaries.grades_tier(user.tier):
        return generation
    return GradedGeneration(generation, canaries, user, last.content)
