"""Running an eval suite on a model: each case through the same path as an API request
(admission, the engine; moderation as configured only for a case that measures the gateway),
scored by its check, the run stored and audited. The judge model grades `judge` checks and
sampled live answers of canaries."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from chatbox.accounts import AuditLog
from chatbox.chat.admission import Gatekeeper
from chatbox.chat.errors import ChatError, Refused
from chatbox.chat.models import ModelProvider
from chatbox.chat.options import TurnOptions
from chatbox.chat.rollout.evalsuite import (
    JUDGE_SYSTEM,
    Answer,
    Case,
    Similarity,
    Suite,
    judge_prompt,
    read_grade,
    score,
)
from chatbox.chat.stateless.completions import complete
from chatbox.chat.stateless.structured import (
    Constraint,
    response_constraint,
    tool_choice_in,
    tool_constraint,
    tools_in,
)
from chatbox.engine.tools import CALL_CLOSE, CALL_OPEN
from chatbox.engine.types import ChatMessage, DoneEvent, TokenEvent, ToolSpec
from chatbox.moderation import ModerationService
from chatbox.store import Store, User
from chatbox.store.evals import EvalResult, EvalRun, detail_json

log = logging.getLogger("chatbox.evals")
Embed = Callable[[list[str]], Awaitable[list[list[float]]]]
JUDGE_MAX_TOKENS = 2  # one digit (a grammar allows nothing else)
JUDGE_GRAMMAR = "root ::= [0-9]"


__all__ = ["CaseOutcome", "EvalError", "EvalResult", "EvalRun", "Evaluator"]


class EvalError(ValueError):
    """An eval that cannot run (unknown model, the admin's tier may not use it)."""


@dataclass(frozen=True)
class CaseOutcome:
    case: Case
    result: EvalResult


class Evaluator:
    """Runs suites; stores and audits each run; grades answers with a judge model."""

    def __init__(
        self,
        store: Store,
        models: ModelProvider,
        gate: Gatekeeper,
        moderation: ModerationService | None,
        audit: AuditLog,
        embed: Embed | None,
    ) -> None:
        self.store = store
        self.models = models
        self.gate = gate
        self.moderation = moderation
        self.audit = audit
        self.embed = embed

    async def run(
        self,
        actor: User,
        model: str,
        suite: Suite,
        judge: str | None = None,
        on_case: Callable[[CaseOutcome], None] | None = None,
    ) -> EvalRun:
        """Every case of the suite on `model`, as `actor`'s requests; the stored run."""
        judge = judge or suite.judge
        for name in (model, judge):
            if name is not None and name not in self.models.names():
                raise EvalError(
                    f"no model named {name!r}; installed: {', '.join(self.models.names())}"
                )
        judged = [c.id for c in suite.cases if c.check.kind == "judge"]
        if judged and judge is None:
            raise EvalError(
                f"the suite has judge checks ({', '.join(judged[:5])}): name a judge model"
                ' with --judge or the suite\'s "judge"'
            )
        started = time.time()
        await self.audit.record(
            actor, "eval.start", None, model=model, suite=suite.name, judge=judge
        )
        results = []
        for case in suite.cases:
            t0 = time.perf_counter()
            answer = await self._answer(actor, model, case)
            latency = time.perf_counter() - t0
            got = await score(case, answer, self.similarity, self._judge(judge))
            shown = answer.text if not answer.calls else json.dumps(list(answer.calls))
            result = EvalResult(
                case.id,
                case.category,
                case.check.kind,
                got.passed,
                got.score,
                latency,
                shown,
                detail_json(got.detail),
            )
            if on_case is not None:
                on_case(CaseOutcome(case, result))
            results.append(result)
        run = await self.store.evals.save(
            model, suite.name, suite.digest, judge, actor.name, started, results
        )
        await self.audit.record(
            actor,
            "eval.run",
            None,
            model=model,
            suite=suite.name,
            run=run.id,
            passed=run.passed,
            cases=run.cases,
        )
        return run

    async def runs(self, model: str | None = None, limit: int = 100) -> list[EvalRun]:
        """Stored runs, the newest first."""
        return await self.store.evals.runs(model, limit)

    async def detail(self, run_id: str) -> tuple[EvalRun, list[EvalResult]]:
        """One run and its results; LookupError when there is none."""
        run = await self.store.evals.run(run_id)
        if run is None:
            raise LookupError("no such eval run")
        return run, await self.store.evals.results(run_id)

    async def compare(self, run_ids: list[str]) -> dict[str, Any]:
        """Runs side by side: each case's score per run (a case missing from a run: None)."""
        runs = []
        scores: dict[str, dict[str, float | None]] = {}
        for run_id in run_ids:
            run, results = await self.detail(run_id)
            runs.append(run)
            for r in results:
                scores.setdefault(r.case_id, {})[run.id] = r.score
        table = [
            {"case": case, "scores": [by_run.get(r.id) for r in runs]}
            for case, by_run in scores.items()
        ]
        return {"runs": runs, "cases": table}

    async def _answer(self, actor: User, model: str, case: Case) -> Answer:
        messages = []
        if case.system:
            messages.append(ChatMessage("system", case.system))
        messages.append(ChatMessage("user", case.prompt))
        try:
            options = _options(model, case)
            name, generation, _ = await complete(
                self.models,
                self.gate,
                case.max_tokens,
                tuple(messages),
                options,
                user=actor,
                moderation=self.moderation if case.measures == "gateway" else None,
            )
            if name != model:
                generation.cancel()
                raise EvalError(
                    f"{actor.name}'s tier ({actor.tier}) is not allowed {model!r}:"
                    f" the policy routed the request to {name!r}"
                )
            text, error = await _collect(generation)
        except Refused as exc:
            return Answer("", refused_by=exc.category)
        except ChatError as exc:
            return Answer("", error=str(exc))
        calls = _calls(text) if case.tools else ()
        return Answer(text, calls, error=error)

    def _judge(self, judge: str | None) -> Callable[[Case, str], Awaitable[float]] | None:
        if judge is None:
            return None

        async def grade(case: Case, answer: str) -> float:
            check = case.check
            return await self.grade(judge, case.prompt, answer, check.reference, check.rubric)

        return grade

    @property
    def similarity(self) -> Similarity | None:
        """The cosine of two texts' embeddings; None without an embedding model."""
        embed = self.embed
        if embed is None:
            return None

        async def cosine(a: str, b: str) -> float:
            va, vb = await embed([a, b])
            return float(sum(x * y for x, y in zip(va, vb, strict=True)))

        return cosine

    async def grade(
        self, judge: str, question: str, answer: str, reference: str = "", rubric: str = ""
    ) -> float:
        """The judge model's grade of an answer, 0..1 (internal work: no admission, no
        moderation, nothing stored; the text lives only in this call)."""
        messages = (
            ChatMessage("system", JUDGE_SYSTEM),
            ChatMessage("user", judge_prompt(question, answer, reference, rubric)),
        )
        options = TurnOptions(
            model=judge,
            temperature=0.0,
            seed=0,
            max_tokens=JUDGE_MAX_TOKENS,
            grammar=JUDGE_GRAMMAR,
        )
        _, generation, _ = await complete(
            self.models, self.gate, JUDGE_MAX_TOKENS, messages, options
        )
        text, _ = await _collect(generation)
        return read_grade(text)


def _options(model: str, case: Case) -> TurnOptions:
    constraint = Constraint()
    tools: tuple[ToolSpec, ...] = ()
    if case.tools:
        tools = tools_in(list(case.tools), case.max_tokens)
        mode, name = tool_choice_in("required", tools)
        constraint = tool_constraint(tools, mode, name, case.max_tokens)
    elif case.response_format is not None:
        constraint = response_constraint(case.response_format, case.max_tokens)
    return TurnOptions(
        model=model,
        temperature=0.0,
        seed=0,
        max_tokens=case.max_tokens,
        grammar=constraint.grammar,
        grammar_triggers=constraint.triggers,
        tools=tools,
    )


async def _collect(generation: object) -> tuple[str, str | None]:
    """The answer's text and its error, if the engine reported one."""
    parts: list[str] = []
    error = None
    async for event in generation:  # type: ignore[attr-defined]
        if isinstance(event, TokenEvent):
            parts.append(event.text)
        elif isinstance(event, DoneEvent) and event.finish_reason == "error":
            error = event.error or "generation failed"
    return "".join(parts), error


def _calls(text: str) -> tuple[dict[str, object], ...]:
    """The tool calls in a generated text (each `<tool_call>{json}</tool_call>`)."""
    out = []
    for chunk in text.split(CALL_OPEN)[1:]:
        body = chunk.split(CALL_CLOSE)[0].strip()
        try:
            call = json.loads(body)
        except json.JSONDecodeError:
            continue
        if isinstance(call, dict):
            out.append(call)
    if not out:  # a grammar-only answer writes the calls' JSON without the tags
        try:
            whole = json.loads(text)
        except json.JSONDecodeError:
            return ()
        items = whole if isinstance(whole, list) else [whole]
        out = [c for c in items if isinstance(c, dict)]
    return tuple(out)
