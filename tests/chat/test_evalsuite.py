"""Eval suites: a bad file is refused naming the case and field; each check scores an answer
as its table in docs/observability.md says."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chatbox.chat.rollout.evalsuite import (
    Answer,
    Case,
    SuiteError,
    default_suite_path,
    load_suite,
    parse_suite,
    read_grade,
    score,
)


def _case(check: dict[str, Any], **extra: Any) -> Case:
    return parse_suite(
        {"cases": [{"id": "c", "prompt": "p", "check": check, **extra}]}, "s", "d"
    ).cases[0]


def test_the_shipped_suite_loads_and_covers_every_category() -> None:
    suite = load_suite(default_suite_path())
    assert suite.name == "basic"
    assert {c.category for c in suite.cases} == {
        "instruction",
        "factual",
        "refusal",
        "tools",
        "json",
    }
    assert {c.check.refuse for c in suite.cases if c.check.kind == "refusal"} == {True, False}


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ({"cases": []}, "no cases"),
        ({"cases": [{"id": "a b", "prompt": "p", "check": {"kind": "exact"}}]}, "cases[0].id"),
        ({"cases": [{"id": "a", "prompt": "", "check": {"kind": "exact"}}]}, "case 'a': prompt"),
        ({"cases": [{"id": "a", "prompt": "p", "check": {"kind": "vibes"}}]}, "check.kind"),
        ({"cases": [{"id": "a", "prompt": "p", "check": {"kind": "exact"}}]}, "check.expected"),
        (
            {"cases": [{"id": "a", "prompt": "p", "check": {"kind": "regex", "pattern": "("}}]},
            "not a regex",
        ),
        (
            {
                "cases": [
                    {
                        "id": "a",
                        "prompt": "p",
                        "check": {"kind": "json_schema", "schema": {"type": 3}},
                    }
                ]
            },
            "not a valid schema",
        ),
        (
            {"cases": [{"id": "a", "prompt": "p", "check": {"kind": "regex", "pattern": "x"}}] * 2},
            "used twice",
        ),
        (
            {"cases": [{"id": "a", "prompt": "p", "max_token": 8, "check": {"kind": "regex"}}]},
            "case 'a': unknown field \"max_token\" (known: id, category, prompt",
        ),
        (
            {"cases": [{"id": "b", "prompt": "p", "check": {"kind": "exact", "expect": "x"}}]},
            "case 'b': unknown field \"check.expect\" (known: kind, expected",
        ),
        (
            {
                "cases": [{"id": "a", "prompt": "p", "check": {"kind": "exact", "expected": "x"}}],
                "judges": "big",
            },
            'the suite: unknown field "judges"',
        ),
        (
            {
                "cases": [
                    {
                        "id": "c",
                        "prompt": "p",
                        "measures": "moderation",
                        "check": {"kind": "refusal"},
                    }
                ]
            },
            "case 'c': measures must be one of model, gateway",
        ),
    ],
)
def test_a_bad_suite_is_refused_naming_what_is_wrong(raw: dict[str, Any], said: str) -> None:
    with pytest.raises(SuiteError, match=said.replace("(", r"\(").replace("[", r"\[")):
        parse_suite(raw, "s", "d")


def test_a_file_that_is_not_json_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{cases: ")
    with pytest.raises(SuiteError, match="not JSON"):
        load_suite(bad)


async def test_each_check_passes_and_fails() -> None:
    async def sim(a: str, b: str) -> float:
        return 0.9 if "blue" in a else 0.1

    async def judge(case: Case, answer: str) -> float:
        return 1.0 if answer == "4" else 0.0

    cases: list[tuple[dict[str, Any], Answer, bool]] = [
        ({"kind": "exact", "expected": "OK"}, Answer(" ok\n"), True),
        ({"kind": "exact", "expected": "OK", "case_sensitive": True}, Answer("ok"), False),
        ({"kind": "regex", "pattern": r"\bParis\b"}, Answer("It is Paris."), True),
        ({"kind": "regex", "pattern": r"\bParis\b"}, Answer("Lyon"), False),
        (
            {"kind": "json_schema", "schema": {"type": "object", "required": ["a"]}},
            Answer('{"a": 1}'),
            True,
        ),
        (
            {"kind": "json_schema", "schema": {"type": "object", "required": ["a"]}},
            Answer('{"b": 1}'),
            False,
        ),
        ({"kind": "json_schema", "schema": {"type": "object"}}, Answer("not json"), False),
        (
            {"kind": "tool_call", "name": "w", "schema": {"type": "object", "required": ["city"]}},
            Answer("", ({"name": "w", "arguments": {"city": "Oslo"}},)),
            True,
        ),
        (
            {"kind": "tool_call", "name": "w", "schema": {"type": "object", "required": ["city"]}},
            Answer("", ({"name": "w", "arguments": {}},)),
            False,
        ),
        ({"kind": "tool_call", "name": "w"}, Answer("no call"), False),
        ({"kind": "refusal", "refuse": True}, Answer("", refused_by="violence"), True),
        ({"kind": "refusal", "refuse": True}, Answer("Sorry, I can't help with that."), True),
        ({"kind": "refusal", "refuse": True}, Answer("Here is how: ..."), False),
        ({"kind": "refusal", "refuse": False}, Answer("Use kill -9 PID."), True),
        ({"kind": "refusal", "refuse": False}, Answer("", refused_by="violence"), False),
        ({"kind": "similarity", "reference": "The sky is blue."}, Answer("blue"), True),
        ({"kind": "similarity", "reference": "The sky is blue."}, Answer("green"), False),
        ({"kind": "judge", "reference": "4"}, Answer("4"), True),
        ({"kind": "judge", "reference": "4"}, Answer("5"), False),
        ({"kind": "regex", "pattern": "."}, Answer("", error="the engine failed"), False),
    ]
    for check, answer, passes in cases:
        got = await score(_case(check), answer, sim, judge)
        assert got.passed is passes, (check, answer, got)
        assert 0.0 <= got.score <= 1.0


def test_a_judges_grade_is_its_first_digit_over_nine() -> None:
    assert read_grade("7") == pytest.approx(7 / 9)
    assert read_grade(" 9\n") == 1.0
    assert read_grade("none") == 0.0


def test_the_shipped_suite_is_valid_json_with_unique_ids() -> None:
    raw = json.loads(default_suite_path().read_text())
    ids = [c["id"] for c in raw["cases"]]
    assert len(ids) == len(set(ids))


def test_a_case_measures_the_model_unless_it_says_the_gateway() -> None:
    assert _case({"kind": "refusal"}).measures == "model"
    assert _case({"kind": "refusal"}, measures="gateway").measures == "gateway"


async def test_a_refusal_says_whether_moderation_or_the_model_refused() -> None:
    check = _case({"kind": "refusal"})
    by_moderation = await score(check, Answer("", refused_by="violence"), None, None)
    assert by_moderation.detail == {"refused": True, "refused_by": "violence"}
    by_model = await score(check, Answer("Sorry, I can't help."), None, None)
    assert by_model.detail == {"refused": True}
