"""Tools as a new user meets them: `chatbox serve` on the shipped model, the shipped policy and
the server's default sampling, through the official client.

Answers are random, so they are judged statistically: text written with tools offered must be
as plausible under the model as text written without them (mean negative log-likelihood per
token, scored by the same GGUF in this process), and forced calls made three at a time under
CPU load must all come back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from llama_cpp import Llama

from tests.integration.test_openai_tools import WEATHER
from tests.served import Served
from tests.web.test_browser import (  # noqa: F401  (browser: a fixture)
    browser,
    mark_answers,
    send,
    signed_in,
    wait_new_answer,
)

# A loaded 2-core machine answers a 40-token request in 10-60 s.
pytestmark = [
    pytest.mark.model,
    pytest.mark.timeout(1200),
    pytest.mark.store_agnostic(
        "sampling under a tool grammar: the answers' text, not where it is kept"
    ),
]

QUESTION = "Write one sentence about the sea."


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with Served(tmp_path_factory.mktemp("tools-shipped"), model=None) as served:
        yield served


def machine_busy() -> bool:
    """True when other processes already keep every core busy (the test command's other
    workers): a burner would only slow them, the load it stands for is there."""
    return os.getloadavg()[0] >= (os.cpu_count() or 1)


def client_of(box: Served, name: str, tier: str) -> openai.OpenAI:
    key = box.user(name, tier=tier)
    return openai.OpenAI(base_url=box.url + "/v1", api_key=key, timeout=600, max_retries=0)


@pytest.fixture(scope="module")
def client(box: Served) -> openai.OpenAI:
    return client_of(box, "ann", "free")


@pytest.fixture(scope="module")
def scorer(smollm2_gguf: Path) -> Iterator[Llama]:
    llm = Llama(
        model_path=str(smollm2_gguf), n_ctx=1024, logits_all=True, n_threads=1, verbose=False
    )
    yield llm
    llm.close()


def mean_nll(llm: Llama, question: str, answer: str) -> float:
    """The answer's mean negative log-likelihood per token under the model, after the
    question in the model's chat format."""
    head = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    prompt = llm.tokenize(head.encode(), add_bos=False, special=True)
    tokens = llm.tokenize(answer.encode(), add_bos=False, special=False)
    llm.reset()
    llm.eval(prompt + tokens)
    rows = np.asarray(llm.scores[len(prompt) - 1 : len(prompt) + len(tokens) - 1], np.float64)
    rows -= rows.max(axis=1, keepdims=True)
    logp = rows - np.log(np.exp(rows).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(tokens)), tokens].mean())


def texts(client: openai.OpenAI, count: int, **extra: object) -> list[str]:
    """Up to `count` text answers to QUESTION (an answer that is a tool call is left out)."""
    out = []
    for _ in range(count):
        reply = client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": QUESTION}],
            max_tokens=30,
            **extra,  # type: ignore[arg-type]
        )
        content = reply.choices[0].message.content
        if content and content.strip():
            out.append(content)
    return out


def test_text_with_tools_offered_is_as_plausible_as_without(
    client: openai.OpenAI, scorer: Llama
) -> None:
    """With a tool offered (auto) the answer is sampled under a lazy grammar; it must read as
    the model's own text, at T=0.7 and at the server's default sampling."""
    plain = texts(client, 3, temperature=0.7)
    offered = texts(client, 3, temperature=0.7, tools=[WEATHER])
    offered += texts(client, 1, tools=[WEATHER])  # the server's default sampling
    assert len(plain) >= 2 and len(offered) >= 2, (plain, offered)
    without = float(np.mean([mean_nll(scorer, QUESTION, a) for a in plain]))
    with_tools = float(np.mean([mean_nll(scorer, QUESTION, a) for a in offered]))
    assert with_tools <= without + 1.0, (with_tools, without, offered)


def test_forced_calls_three_at_a_time_under_load_all_answer(box: Served) -> None:
    """Twelve forced calls (required and named), three at a time from a member whose tier
    allows four streams, while another process keeps a core busy (or the machine's cores are
    busy already): every one comes back with a call (a call cut by max_tokens still names its
    tool)."""
    client = client_of(box, "bea", "paid")
    burners = (
        [] if machine_busy() else [subprocess.Popen([sys.executable, "-c", "while True: pass"])]
    )

    def call(i: int) -> openai.types.chat.ChatCompletion:
        choice: object = (
            "required" if i % 2 else {"type": "function", "function": {"name": "get_weather"}}
        )
        return client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": f"What is the weather in city number {i}?"}],
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice=choice,  # type: ignore[arg-type]
            max_tokens=60,
            timeout=600,
        )

    try:
        with ThreadPoolExecutor(3) as pool:
            replies = list(pool.map(call, range(12)))
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert len(replies) == 12
    for reply in replies:
        calls = reply.choices[0].message.tool_calls or []
        assert calls and calls[0].function.name == "get_weather", reply  # type: ignore[union-attr]
        if reply.choices[0].finish_reason == "tool_calls":  # complete: its arguments parse
            assert isinstance(json.loads(calls[0].function.arguments), dict)  # type: ignore[union-attr]


@pytest.mark.browser
def test_answers_with_the_composers_tools_switch_on_read_as_the_models_own(
    box: Served,
    client: openai.OpenAI,
    scorer: Llama,
    browser: Any,  # noqa: F811
) -> None:
    """The UI as a new user meets it: Chromium, the Tools switch on, the shipped model and
    the server's default sampling. Each chat's answer, written after whatever tools the model
    chose to call, reads as the model's own text: its mean NLL is within 1.0 of answers
    written without tools."""
    http = httpx.Client(base_url=box.url, headers=box.auth(box.user("uma")), timeout=60)
    page, errors = signed_in(browser, box.url, "uma", "umauma")
    answers = []
    for _ in range(2):
        page.goto(box.url + "/")
        page.wait_for_selector("#composer-input", timeout=120_000)
        page.get_by_role("switch", name="Tools").check()
        mark_answers(page)
        send(page, QUESTION)
        wait_new_answer(page, timeout=900_000)
        conv = page.url.rsplit("/c/", 1)[1].split("?")[0]
        turns = http.get(f"/v1/conversations/{conv}").json()["turns"]
        [answer] = [t for t in turns if t["role"] == "assistant"]
        assert answer["status"] == "complete", answer
        assert answer["usage"]["prompt_tokens"] > 300, answer  # the tools' descriptions
        answers.append(answer["content"])
    page.context.close()
    assert not errors, errors
    plain = texts(client, 3)
    assert len(plain) >= 2 and all(a.strip() for a in answers), (plain, answers)
    without = float(np.mean([mean_nll(scorer, QUESTION, a) for a in plain]))
    with_tools = float(np.mean([mean_nll(scorer, QUESTION, a) for a in answers]))
    assert with_tools <= without + 1.0, (with_tools, without, answers)
