"""Live answers of a canary's tier scored against its eval suite's references: a canary whose
answers miss the references its baseline meets is held on its eval score (no judge needed);
questions outside the suite go to the judge, told nothing else; a missing grader gives no
sample rather than a zero; a bad suite file is refused naming the canary."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from chatbox.accounts import AuditLog
from chatbox.chat.policy import Policy
from chatbox.chat.rollout.canary import MIN_SAMPLES, CanaryService
from chatbox.chat.rollout.evalsuite import SuiteError
from chatbox.store import Store, User

CASES = [
    {
        "id": "capital",
        "prompt": "What is the capital of France?",
        "check": {"kind": "exact", "expected": "Paris"},
    },
    {
        "id": "legs",
        "prompt": "How many legs has a spider?",
        "check": {"kind": "regex", "pattern": "\\b8\\b|eight"},
    },
    {"id": "alike", "prompt": "Say hi.", "check": {"kind": "similarity", "reference": "Hi!"}},
]
RIGHT = {"What is the capital of France?": "Paris", "How many legs has a spider?": "It has 8."}
WRONG = {"What is the capital of France?": "Lyon", "How many legs has a spider?": "Six."}


def policy_with_suite(tmp_path: Path, **canary: object) -> Policy:
    (tmp_path / "golden.json").write_text(json.dumps({"name": "golden", "cases": CASES}))
    body = {"tier": "free", "model": "next", "percent": 50, "arm": "nx", "eval_percent": 100}
    toml = "[[routing.canary]]\n" + "".join(
        f"{k} = {json.dumps(v)}\n"
        for k, v in {**body, "eval_suite": "golden.json", **canary}.items()
    )
    (tmp_path / "policy.toml").write_text(toml)
    return Policy.load(tmp_path / "policy.toml")  # the suite's path is the policy file's


async def test_a_canary_missing_the_references_its_baseline_meets_is_held_on_eval_score(
    tmp_path: Path,
    database: Path | str,
) -> None:
    store = await Store.open(database)
    try:
        service = CanaryService(store, policy_with_suite(tmp_path), AuditLog(store))
        service.check_suites()
        user = User("u", "ann", "member", "free", False, 0.0)
        for i in range(MIN_SAMPLES + 5):
            question = list(RIGHT)[i % 2]
            service.sample_live(user, "", f"  {question.upper()} ", RIGHT[question])
            service.sample_live(user, "nx", question, WRONG[question])
            service.sample_live(user, "nx", "Something not in the suite?", "whatever")
            service.sample_live(user, "nx", "Say hi.", "hello")  # no embedder: no sample
        await asyncio.gather(*service._jobs)
        assert len(service.sides.arm("nx").scores) == MIN_SAMPLES + 5  # no judge: unscored
        (v,) = await service.tick()
        assert v.verdict == "hold" and v.deciding == "eval_score", v.reason
        assert v.reason.startswith("eval_score worse by +100.0 pts")
        assert service.state("nx") == "held"
    finally:
        await store.close()


async def test_questions_outside_the_suite_go_to_the_judge_and_judge_cases_get_the_reference(
    tmp_path: Path,
    database: Path | str,
) -> None:
    store = await Store.open(database)
    asked: list[tuple[str, str, str]] = []

    async def grade(
        judge: str, question: str, answer: str, reference: str = "", rubric: str = ""
    ) -> float:
        asked.append((judge, question, reference))
        return 1.0

    try:
        policy = policy_with_suite(tmp_path, judge="big")
        service = CanaryService(store, policy, AuditLog(store), grade=grade)
        user = User("u", "ann", "member", "free", False, 0.0)
        service.sample_live(user, "nx", "Tell me a joke.", "No.")
        service.sample_live(user, "nx", "What is the capital of France?", "Lyon")
        await asyncio.gather(*service._jobs)
        assert asked == [("big", "Tell me a joke.", "")]  # the exact case needs no judge
        assert [v for _, v in service.sides.arm("nx").scores] == [1.0, 0.0]
    finally:
        await store.close()


async def test_a_canary_suite_that_cannot_be_read_is_refused_naming_the_canary(
    tmp_path: Path,
    database: Path | str,
) -> None:
    store = await Store.open(database)
    try:
        policy = policy_with_suite(tmp_path, eval_suite="missing.json")
        service = CanaryService(store, policy, AuditLog(store))
        with pytest.raises(SuiteError, match="canary nx's eval_suite: cannot read the suite"):
            service.check_suites()
    finally:
        await store.close()
