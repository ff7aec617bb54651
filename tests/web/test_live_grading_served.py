"""A canary that answers worse, held by its live eval score on a served box: tier `gamma`
sends half its OpenAI-API requests to `worse` (a tiny model of other weights); the canary's
eval suite holds the baseline model's own greedy answers as references (a regression suite).
Answers to the suite's questions, whole and streamed, are scored live against them; the
canary is held with a verdict naming eval_score, on the console and in /metrics. Requests
under zero retention and requests that picked a model are never scored."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from chatbox.chat.rollout.canary import MIN_SAMPLES
from tests.conftest import _answers_unchecked
from tests.served import Served
from tests.tinymodel import make_tiny_gguf

pytestmark = pytest.mark.timeout(600)
TIMEOUT = 120.0
QUESTIONS = ["What is the capital of France?", "Name a primary colour.", "What is two plus two?"]
GAMMA = """
[tiers.gamma]
rpm = 6000
tpm = 100000000
max_streams = 4
model = "tiny"
priority = 1

[[routing.canary]]
tier = "gamma"
model = "worse"
percent = 50
arm = "worse-canary"
eval_percent = 100
eval_suite = "golden.json"
"""


def golden_suite(box: Served, where: Path) -> None:
    """The baseline's greedy answers to QUESTIONS, as exact references (golden.json)."""
    probe = where / "probe.json"
    cases = [
        {"id": f"q{i}", "prompt": q, "max_tokens": 8, "check": {"kind": "regex", "pattern": "."}}
        for i, q in enumerate(QUESTIONS)
    ]
    probe.write_text(json.dumps({"name": "probe", "cases": cases}))
    run = json.loads(box.cli("eval", "run", "tiny", "--suite", str(probe), "--json"))
    answers = {r["case_id"]: r["answer"] for r in run["results"]}
    for case in cases:
        case["check"] = {
            "kind": "exact",
            "expected": answers[str(case["id"])],
            "case_sensitive": True,
        }
    (where / "golden.json").write_text(json.dumps({"name": "golden", "cases": cases}))


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Served]:
    where = tmp_path_factory.mktemp("live-grading")
    policy = _answers_unchecked(None, where)
    text = policy.read_text()
    cache = text.index("[answer_cache]")  # every answer is generated, none served from RAM
    text = text[:cache] + text[cache:].replace("enabled = true", "enabled = false", 1)
    text = text.replace("\n[overload]\n", GAMMA.split("[[routing")[0] + "\n[overload]\n", 1)
    policy.write_text(text + "\n[[routing" + GAMMA.split("[[routing")[1])
    served = Served(where, model=tiny_gguf, policy=policy, env={"CHATBOX_REPLAY_SPEED": "5"})
    worse = make_tiny_gguf(where / "worse.gguf", seed=11)
    served.cli("models", "add", str(worse), "--name", "worse", "--link")
    golden_suite(served, where)
    served.gamma = [served.user(f"gamma{i}", tier="gamma") for i in range(3)]  # type: ignore[attr-defined]
    with served:
        yield served


def ask(box: Served, key: str, question: str, **extra: Any) -> httpx.Response:
    headers = {**box.auth(key), **extra.pop("headers", {})}
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": 8, **extra}
    body.setdefault("temperature", 0.0)
    return httpx.post(box.url + "/v1/chat/completions", json=body, headers=headers, timeout=TIMEOUT)


def eval_score(box: Served) -> dict[str, Any]:
    found = httpx.get(box.url + "/console/data/canaries", headers=box.admin, timeout=TIMEOUT)
    (canary,) = found.json()["canaries"]
    metrics = {m["metric"]: m for m in (canary["verdict"] or {}).get("metrics", [])}
    return {"canary": canary, "eval_score": metrics.get("eval_score")}


def test_the_canary_that_answers_worse_is_held_on_its_live_eval_score(box: Served) -> None:
    keys: list[str] = box.gamma  # type: ignore[attr-defined]
    # Neither kept nor scored: zero retention (header) and a picked model.
    for i in range(4):
        zdr = {"X-Chatbox-Retention": "none"}
        assert ask(box, keys[0], QUESTIONS[i % 3], headers=zdr).status_code == 200
        assert ask(box, keys[1], QUESTIONS[i % 3], model="worse").status_code == 200
    sent = 0

    def one(i: int) -> str:
        reply = ask(box, keys[i % 3], QUESTIONS[i % 3], stream=i % 2 == 1)
        assert reply.status_code == 200, reply.text
        return reply.headers.get("x-chatbox-arm", "")

    arms: list[str] = []
    with ThreadPoolExecutor(3) as pool:
        while min(arms.count(""), arms.count("worse-canary")) < MIN_SAMPLES + 5:
            arms += list(pool.map(one, range(sent, sent + 6)))
            sent += 6
    deadline = time.monotonic() + 60
    while True:
        seen = eval_score(box)
        state = seen["canary"]["state"]
        score = seen["eval_score"] or {"arm": {"n": 0}, "baseline": {"n": 0}}
        counted = score["arm"]["n"] + score["baseline"]["n"]
        if (state == "held" and counted >= sent) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    score = seen["eval_score"]
    assert state == "held", seen
    verdict = seen["canary"]["verdict"]
    assert verdict["verdict"] == "hold" and verdict["metric"] == "eval_score", verdict
    assert verdict["reason"].startswith("eval_score worse by"), verdict
    # Every answer of the tier's own routes was scored (by the newest verdict), none else.
    assert score["arm"]["n"] + score["baseline"]["n"] == sent, (score, sent)
    assert score["baseline"]["mean"] > score["arm"]["mean"] + 0.5, score
    metrics = httpx.get(box.url + "/metrics", headers=box.admin, timeout=TIMEOUT).text
    assert 'chatbox_canary_verdict{arm="worse-canary",tier="gamma",verdict="hold"} 1.0' in metrics
    assert 'metric="eval_score"' in metrics
    events = seen["canary"]["events"]
    assert events[0]["action"] == "hold" and events[0]["automatic"], events
