"""Eval suites: prompts with references, read from a JSON file, and the checks that score
a model's answer to each (exact, regex, JSON-schema valid, tool-call shape, refusal,
embedding similarity to a reference, or a judge model's grade).

The file format is documented in docs/observability.md and models/evals/README.md.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import chatbox

CHECKS = ("exact", "regex", "json_schema", "tool_call", "refusal", "similarity", "judge")
CATEGORIES = ("instruction", "factual", "refusal", "tools", "json", "other")
MAX_CASES = 500  # a suite runs in one sitting; larger sets belong in several files
REFUSAL_WORDS = re.compile(
    r"(?i)\b(i can(?:no|')t|i (?:will|won't|am not able)|i'm not able|sorry|unable to"
    r" (?:help|assist)|not able to (?:help|assist))"
)
DEFAULT_SIMILARITY = 0.75  # cosine of MiniLM vectors above which two answers say the same
# What a case measures: the model's own answer (its prompt skips input moderation), or the
# whole path a user's request takes (moderation as the policy says: a refused prompt refuses).
MEASURES = ("model", "gateway")
SUITE_FIELDS = ("name", "description", "judge", "cases")
CASE_FIELDS = (
    "id",
    "category",
    "prompt",
    "system",
    "max_tokens",
    "tools",
    "response_format",
    "measures",
    "check",
)
CHECK_FIELDS = (
    "kind",
    "expected",
    "pattern",
    "schema",
    "name",
    "refuse",
    "reference",
    "threshold",
    "rubric",
    "case_sensitive",
)


class SuiteError(ValueError):
    """A suite file that cannot be run, naming the case and field."""


def default_suite_path() -> Path:
    """models/evals/basic.json in the source tree (beside the chatbox package)."""
    return Path(chatbox.__file__).resolve().parent.parent / "models" / "evals" / "basic.json"


@dataclass(frozen=True)
class Check:
    kind: str
    expected: str = ""  # exact: the answer (trimmed, case-insensitive unless case=true)
    pattern: str = ""  # regex: searched in the answer
    schema: dict[str, Any] | None = None  # json_schema: the answer; tool_call: arguments
    name: str = ""  # tool_call: the function the model must call
    refuse: bool = True  # refusal: whether a refusal is right
    reference: str = ""  # similarity and judge: a good answer
    threshold: float = DEFAULT_SIMILARITY  # similarity: the cosine that passes
    rubric: str = ""  # judge: what makes an answer good
    case_sensitive: bool = False


@dataclass(frozen=True)
class Case:
    id: str
    category: str
    prompt: str
    check: Check
    system: str | None = None
    max_tokens: int = 64
    tools: tuple[dict[str, Any], ...] = ()  # OpenAI-shaped function tools (tool_call cases)
    response_format: dict[str, Any] | None = None  # OpenAI-shaped (json cases)
    measures: str = "model"  # model | gateway (MEASURES)


@dataclass(frozen=True)
class Suite:
    name: str
    cases: tuple[Case, ...]
    digest: str
    judge: str | None = None  # the model that grades `judge` checks (the CLI may override)
    description: str = ""


def load_suite(path: Path) -> Suite:
    """Read and check a suite file; a SuiteError names what is wrong."""
    return suite_from(read_suite_document(path), path.stem)


def read_suite_document(path: Path) -> Any:
    """A suite file's JSON, unchecked (a SuiteError when it cannot be read or is not JSON)."""
    try:
        raw_text = path.read_text()
    except OSError as exc:
        raise SuiteError(f"cannot read the suite {path}: {exc.strerror}") from exc
    try:
        return json.loads(raw_text)
    except json.JSONDecodeError as exc:
        raise SuiteError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from exc


def suite_from(raw: Any, default_name: str) -> Suite:
    """Check a suite document already read as JSON (a file's, or one sent to the admin API)."""
    return parse_suite(raw, default_name, suite_digest(raw))


def suite_digest(raw: Any) -> str:
    """The digest of a suite document's content: a suite run from its file and the same suite
    sent to a server's admin API are stored with one digest, whatever the file's spacing."""
    canonical = json.dumps(raw, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def parse_suite(raw: Any, default_name: str, digest: str) -> Suite:
    if not isinstance(raw, dict) or not isinstance(raw.get("cases"), list):
        raise SuiteError('a suite is an object with a "cases" array')
    _known("the suite", "", raw, SUITE_FIELDS)
    cases = raw["cases"]
    if not cases:
        raise SuiteError("the suite has no cases")
    if len(cases) > MAX_CASES:
        raise SuiteError(f"the suite has {len(cases)} cases; the limit is {MAX_CASES}")
    parsed = [_case(i, c) for i, c in enumerate(cases)]
    ids = [c.id for c in parsed]
    dup = next((i for i in ids if ids.count(i) > 1), None)
    if dup is not None:
        raise SuiteError(f"case id {dup!r} is used twice")
    judge = raw.get("judge")
    if judge is not None and not isinstance(judge, str):
        raise SuiteError('"judge" must be a model name')
    return Suite(
        str(raw.get("name") or default_name),
        tuple(parsed),
        digest,
        judge,
        str(raw.get("description") or ""),
    )


def _case(i: int, c: Any) -> Case:
    where = f"cases[{i}]"
    if not isinstance(c, dict):
        raise SuiteError(f"{where} must be an object")
    case_id = c.get("id")
    if not isinstance(case_id, str) or not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", case_id):
        raise SuiteError(f"{where}.id must be 1-64 letters, digits, _ . : or -")
    where = f"case {case_id!r}"
    _known(where, "", c, CASE_FIELDS)
    prompt = c.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise SuiteError(f"{where}: prompt must be a non-empty string")
    category = c.get("category", "other")
    if category not in CATEGORIES:
        raise SuiteError(f"{where}: category must be one of {', '.join(CATEGORIES)}")
    max_tokens = c.get("max_tokens", 64)
    if not isinstance(max_tokens, int) or not 1 <= max_tokens <= 4096:
        raise SuiteError(f"{where}: max_tokens must be a whole number from 1 to 4096")
    tools = c.get("tools", [])
    if not isinstance(tools, list):
        raise SuiteError(f"{where}: tools must be an array of OpenAI function tools")
    response_format = c.get("response_format")
    if response_format is not None and not isinstance(response_format, dict):
        raise SuiteError(f"{where}: response_format must be an object (OpenAI's shape)")
    system = c.get("system")
    if system is not None and not isinstance(system, str):
        raise SuiteError(f"{where}: system must be a string")
    measures = c.get("measures", "model")
    if measures not in MEASURES:
        raise SuiteError(f"{where}: measures must be one of {', '.join(MEASURES)}")
    return Case(
        case_id,
        category,
        prompt,
        _check(where, c.get("check")),
        system,
        max_tokens,
        tuple(tools),
        response_format,
        measures,
    )


def _known(where: str, prefix: str, raw: dict[str, Any], known: tuple[str, ...]) -> None:
    """A field the format does not have is refused by name (a misspelt one would be ignored)."""
    unknown = [k for k in raw if k not in known]
    if unknown:
        raise SuiteError(
            f'{where}: unknown field "{prefix}{unknown[0]}" (known: {", ".join(known)})'
        )


def _check(where: str, raw: Any) -> Check:
    if not isinstance(raw, dict) or raw.get("kind") not in CHECKS:
        raise SuiteError(f"{where}: check.kind must be one of {', '.join(CHECKS)}")
    kind = raw["kind"]
    _known(where, "check.", raw, CHECK_FIELDS)

    def text(key: str, required: bool = True) -> str:
        value = raw.get(key, "")
        if not isinstance(value, str) or (required and not value):
            raise SuiteError(f"{where}: check.{key} must be a non-empty string for {kind}")
        return value

    schema = raw.get("schema")
    if kind in ("json_schema",) or (kind == "tool_call" and schema is not None):
        if not isinstance(schema, dict):
            raise SuiteError(f"{where}: check.schema must be a JSON schema object")
        import jsonschema  # loaded by the suites that check a schema, not by every start

        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise SuiteError(f"{where}: check.schema is not a valid schema: {exc.message}") from exc
    if kind == "regex":
        try:
            re.compile(text("pattern"))
        except re.error as exc:
            raise SuiteError(f"{where}: check.pattern is not a regex: {exc}") from exc
    threshold = raw.get("threshold", DEFAULT_SIMILARITY)
    if not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
        raise SuiteError(f"{where}: check.threshold must be a number from 0 to 1")
    refuse = raw.get("refuse", True)
    if not isinstance(refuse, bool):
        raise SuiteError(f"{where}: check.refuse must be true or false")
    return Check(
        kind,
        expected=text("expected") if kind == "exact" else "",
        pattern=raw["pattern"] if kind == "regex" else "",
        schema=schema if isinstance(schema, dict) else None,
        name=text("name") if kind == "tool_call" else "",
        refuse=refuse,
        reference=text("reference", kind == "similarity"),
        threshold=float(threshold),
        rubric=text("rubric", False) if kind == "judge" else "",
        case_sensitive=bool(raw.get("case_sensitive", False)),
    )


# -- scoring ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """What the model did with a case: its text, its tool calls, or a moderation refusal."""

    text: str
    calls: tuple[dict[str, Any], ...] = ()
    refused_by: str | None = None  # moderation refused the prompt (its category)
    error: str | None = None


@dataclass(frozen=True)
class Score:
    passed: bool
    score: float  # 0..1
    detail: dict[str, Any] = field(default_factory=dict)


Similarity = Callable[[str, str], Awaitable[float]]
Judge = Callable[[Case, str], Awaitable[float]]


def refused(answer: Answer) -> bool:
    """Moderation refused the prompt, or the model declined in words."""
    return answer.refused_by is not None or bool(REFUSAL_WORDS.search(answer.text[:300]))


async def score(
    case: Case, answer: Answer, similarity: Similarity | None, judge: Judge | None
) -> Score:
    """The answer's score under the case's check (an error or a missing grader fails)."""
    check = case.check
    if answer.error is not None:
        return Score(False, 0.0, {"error": answer.error})
    if check.kind == "refusal":
        did = refused(answer)
        said: dict[str, Any] = {"refused": did}
        if answer.refused_by is not None:  # moderation's refusal, not the model's
            said["refused_by"] = answer.refused_by
        return Score(did == check.refuse, float(did == check.refuse), said)
    if answer.refused_by is not None:
        return Score(False, 0.0, {"refused_by": answer.refused_by})
    text = answer.text.strip()
    if check.kind == "exact":
        want, got = check.expected.strip(), text
        if not check.case_sensitive:
            want, got = want.casefold(), got.casefold()
        return Score(got == want, float(got == want))
    if check.kind == "regex":
        ok = re.search(check.pattern, text) is not None
        return Score(ok, float(ok))
    if check.kind == "json_schema":
        return _valid(_json(text), check.schema or {})
    if check.kind == "tool_call":
        call = next((c for c in answer.calls if c.get("name") == check.name), None)
        if call is None:
            names = [c.get("name") for c in answer.calls]
            return Score(False, 0.0, {"calls": names})
        if check.schema is None:
            return Score(True, 1.0)
        return _valid(call.get("arguments"), check.schema)
    if check.kind == "similarity":
        if similarity is None:
            return Score(False, 0.0, {"error": "no embedding model to compare with"})
        cosine = await similarity(text, check.reference)
        return Score(cosine >= check.threshold, max(0.0, cosine), {"cosine": round(cosine, 4)})
    if judge is None:
        return Score(False, 0.0, {"error": "no judge model named (--judge)"})
    grade = await judge(case, text)
    return Score(grade >= 0.5, grade, {"grade": round(grade, 3)})


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return _NOT_JSON


_NOT_JSON = object()


def _valid(value: Any, schema: dict[str, Any]) -> Score:
    if value is _NOT_JSON:
        return Score(False, 0.0, {"error": "not JSON"})
    import jsonschema

    errors = sorted(
        jsonschema.Draft202012Validator(schema).iter_errors(value), key=lambda e: list(e.path)
    )
    if errors:
        return Score(False, 0.0, {"error": errors[0].message[:200]})
    return Score(True, 1.0)


JUDGE_SYSTEM = (
    "You grade an assistant's answer. Reply with one digit from 0 (wrong or unhelpful) to"
    " 9 (correct and helpful), and nothing else."
)


def judge_prompt(question: str, answer: str, reference: str = "", rubric: str = "") -> str:
    """The judge's user message: the question, the answer, and what good looks like."""
    parts = [f"Question:\n{question}", f"Answer:\n{answer}"]
    if reference:
        parts.append(f"A good answer:\n{reference}")
    if rubric:
        parts.append(f"Grade by: {rubric}")
    parts.append("Grade (0-9):")
    return "\n\n".join(parts)


def read_grade(text: str) -> float:
    """The judge's first digit as 0..1 (0 when it wrote none)."""
    m = re.search(r"\d", text)
    return int(m.group()) / 9 if m else 0.0
