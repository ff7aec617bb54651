"""The OpenAI-contract assertions of llama.cpp's server tests (tools/server/tests/unit:
test_chat_completion.py, test_completion.py, test_tool_call.py), ported to `chatbox serve`.

Kept: what any OpenAI-compatible server must do (chat, streaming, response_format, logprobs,
logit_bias, n, seed, tool calls, text completions, invalid requests). Left out: what is
llama.cpp's own (its /completion and /tokenize endpoints, `grammar`, timings, prompt
progress, templates by name, the text a particular model writes). Where llama.cpp departs
from OpenAI, OpenAI is asserted: a context overflow is 400 `context_length_exceeded`, and
a plain answer's first streamed delta may carry `content: ""` (OpenAI's) or null.
One served process for the module, on the tiny random model (answers run to max_tokens).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.served import Served
from tests.tinymodel import tiny_vocab

BOOK = [
    {"role": "system", "content": "Book"},
    {"role": "user", "content": "What is the best book"},
]
TOOL = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Runs code in an ipython interpreter and returns the result.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "maxLength": 20}},
            "required": ["code"],
        },
    },
}


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Served]:
    with Served(tmp_path_factory.mktemp("llama-contract"), model=tiny_gguf) as served:
        yield served


@pytest.fixture(scope="module")
def key(box: Served) -> str:
    return box.user("ann", tier="paid")


@pytest.fixture(scope="module")
def client(box: Served, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=box.url + "/v1", api_key=key, max_retries=0)


def post(box: Served, key: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(box.url + "/v1" + path, json=body, headers=box.auth(key), timeout=120)


def events(box: Served, key: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """A streamed chat completion's chunks, as sent (before the client parses them)."""
    out = []
    with httpx.stream(
        "POST",
        box.url + "/v1/chat/completions",
        json={**body, "stream": True},
        headers=box.auth(key),
        timeout=120,
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
    return out


# -- chat completions ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "user",
    [
        "What is the best book",
        [{"type": "text", "text": "What is"}, {"type": "text", "text": " the best book"}],
    ],
)
def test_chat_completion(box: Served, key: str, user: Any) -> None:
    messages = [{"role": "system", "content": "Book"}, {"role": "user", "content": user}]
    res = post(box, key, "/chat/completions", {"max_tokens": 8, "messages": messages})
    assert res.status_code == 200
    body = res.json()
    assert "cmpl" in body["id"] and body["system_fingerprint"]
    assert body["usage"]["completion_tokens"] == 8 and body["usage"]["prompt_tokens"] > 0
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert choice["finish_reason"] == "length"


def test_chat_completion_stream(box: Served, key: str) -> None:
    body = {"max_tokens": 8, "messages": BOOK, "stream_options": {"include_usage": True}}
    chunks = events(box, key, body)
    whole = post(box, key, "/chat/completions", {"max_tokens": 8, "messages": BOOK}).json()
    assert len({c["id"] for c in chunks}) == 1
    assert len({c["system_fingerprint"] for c in chunks}) == 1 and chunks[0]["system_fingerprint"]
    assert {c["model"] for c in chunks} == {whole["model"]}
    content = ""
    for i, chunk in enumerate(chunks):
        if not chunk["choices"]:  # the usage chunk, last
            assert chunk is chunks[-1]
            assert chunk["usage"]["completion_tokens"] == 8
            assert chunk["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"]
            continue
        choice = chunk["choices"][0]
        if i == 0:
            assert choice["delta"]["role"] == "assistant"
            assert choice["delta"].get("content") in ("", None)
        else:
            assert "role" not in choice["delta"]
        if choice["finish_reason"] is not None:
            assert choice["finish_reason"] == "length" and "content" not in choice["delta"]
        else:
            content += choice["delta"].get("content") or ""
    assert content


def test_chat_completion_with_openai_library(client: openai.OpenAI) -> None:
    res = client.chat.completions.create(
        model="tiny",
        messages=BOOK,  # type: ignore[arg-type]
        max_tokens=8,
        seed=42,
        temperature=0.8,
    )
    assert res.system_fingerprint
    assert res.choices[0].finish_reason == "length"
    assert res.choices[0].message.content is not None


@pytest.mark.parametrize(
    ("response_format", "max_tokens", "expected"),
    [
        (
            {"type": "json_schema", "json_schema": {"name": "c", "schema": {"const": "42"}}},
            6,
            '"42"',
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "c", "schema": {"const": "foooooo"}}},
            10,
            '"foooooo"',
        ),
        ({"type": "json_object"}, 10, None),
    ],
)
def test_completion_with_response_format(
    box: Served, key: str, response_format: dict[str, Any], max_tokens: int, expected: str | None
) -> None:
    res = post(
        box,
        key,
        "/chat/completions",
        {"max_tokens": max_tokens, "messages": BOOK, "response_format": response_format},
    )
    assert res.status_code == 200, res.text
    content = res.json()["choices"][0]["message"]["content"]
    if expected is not None:
        assert content == expected
    else:
        assert content.startswith("{")  # an object, cut by max_tokens


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "sound"},
        {"type": "json_schema", "json_schema": {"name": "c", "schema": 123}},
        {"type": "json_schema", "json_schema": {"name": "c", "schema": {"type": 123}}},
        {"type": "json_schema", "json_schema": {"name": "c", "schema": {"type": "hiccup"}}},
    ],
)
def test_an_invalid_response_format_is_400(
    box: Served, key: str, response_format: dict[str, Any]
) -> None:
    body = {"max_tokens": 4, "messages": BOOK, "response_format": response_format}
    res = post(box, key, "/chat/completions", body)
    assert res.status_code == 400, res.text
    assert res.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "messages",
    [
        None,
        "string",
        [123],
        [{}],
        [{"role": 123}],
        [{"role": "system", "content": 123}],
        [{"role": "system", "content": "test"}, {}],
    ],
)
def test_invalid_chat_completion_req(box: Served, key: str, messages: Any) -> None:
    res = post(box, key, "/chat/completions", {"messages": messages})
    assert res.status_code == 400, res.text
    error = res.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]


def test_logprobs(client: openai.OpenAI) -> None:
    res = client.chat.completions.create(
        model="tiny",
        temperature=0.0,
        messages=BOOK,  # type: ignore[arg-type]
        max_tokens=5,
        logprobs=True,
        top_logprobs=10,
    )
    logprobs = res.choices[0].logprobs
    assert logprobs is not None and logprobs.content
    for token in logprobs.content:
        assert token.logprob <= 0.0 and token.bytes is not None and token.top_logprobs
    assert "".join(t.token for t in logprobs.content) == res.choices[0].message.content


def test_logprobs_stream(client: openai.OpenAI) -> None:
    res = client.chat.completions.create(
        model="tiny",
        temperature=0.0,
        messages=BOOK,  # type: ignore[arg-type]
        max_tokens=5,
        logprobs=True,
        top_logprobs=10,
        stream=True,
    )
    output = aggregated = ""
    for i, chunk in enumerate(res):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        if i == 0:
            assert choice.delta.role == "assistant" and not choice.delta.content
            continue
        assert choice.delta.role is None
        if choice.finish_reason is None:
            output += choice.delta.content or ""
            assert choice.logprobs is not None and choice.logprobs.content is not None
            for token in choice.logprobs.content:
                aggregated += token.token
                assert token.logprob <= 0.0 and token.bytes is not None and token.top_logprobs
    assert output and aggregated == output


def test_logit_bias(client: openai.OpenAI) -> None:
    """Every token that writes an "e" banned: the answer has none."""
    tokens = tiny_vocab()[0]
    banned = {str(i): -100 for i, t in enumerate(tokens) if "e" in t or "E" in t}
    res = client.chat.completions.create(
        model="tiny",
        temperature=0.0,
        messages=BOOK,  # type: ignore[arg-type]
        max_tokens=64,
        logit_bias=banned,  # type: ignore[arg-type]
    )
    text = res.choices[0].message.content
    assert text and "e" not in text.lower()


def test_context_size_exceeded(box: Served, key: str, client: openai.OpenAI) -> None:
    long = [{"role": "user", "content": "What is the best book " * 400}] * 10
    res = post(box, key, "/chat/completions", {"messages": long})
    assert res.status_code == 400
    error = res.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    with pytest.raises(openai.BadRequestError) as e:  # streamed: refused before the stream
        for _ in client.chat.completions.create(model="tiny", messages=long, stream=True):  # type: ignore[arg-type]
            pass
    assert e.value.code == "context_length_exceeded"


def test_chat_completions_multiple_choices(box: Served, key: str) -> None:
    res = post(box, key, "/chat/completions", {"max_tokens": 8, "n": 2, "messages": BOOK})
    assert res.status_code == 200
    choices = res.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    for choice in choices:
        assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"


def test_consistent_result_same_seed(client: openai.OpenAI) -> None:
    answers = {
        client.chat.completions.create(
            model="tiny",
            messages=BOOK,  # type: ignore[arg-type]
            max_tokens=12,
            seed=42,
            temperature=1.0,
        )
        .choices[0]
        .message.content
        for _ in range(3)
    }
    assert len(answers) == 1


# -- text completions ---------------------------------------------------------------------


def test_completion_with_openai_library(client: openai.OpenAI) -> None:
    res = client.completions.create(
        model="tiny", prompt="I believe the meaning of life is", max_tokens=8
    )
    assert res.system_fingerprint
    assert res.choices[0].finish_reason == "length" and res.choices[0].text is not None


def test_completion_stream_vs_non_stream(client: openai.OpenAI) -> None:
    prompt = "I believe the meaning of life is"
    streamed = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=8, seed=7, stream=True
    )
    text = ""
    finish = None
    for chunk in streamed:
        choice = chunk.choices[0]
        if choice.finish_reason is None:
            text += choice.text
        else:
            finish = choice.finish_reason
    whole = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, seed=7)
    assert finish == "length" and text == whole.choices[0].text


# -- tool calls ---------------------------------------------------------------------------


def _one_call(message: Any) -> dict[str, Any]:
    calls = message.tool_calls or []
    assert calls, message
    call = calls[0]
    assert call.type == "function" and isinstance(call.id, str) and call.id
    assert call.function.name == "python"
    arguments = json.loads(call.function.arguments)
    assert isinstance(arguments["code"], str)
    return dict(arguments)


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "python"}}]
)
def test_completion_with_required_tool(client: openai.OpenAI, tool_choice: Any) -> None:
    res = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Write a hello world in python"}],
        tools=[TOOL],  # type: ignore[list-item]
        tool_choice=tool_choice,
        parallel_tool_calls=False,  # the tiny model would go on calling until max_tokens
        max_tokens=200,
    )
    choice = res.choices[0]
    assert choice.finish_reason == "tool_calls"
    _one_call(choice.message)


def test_completion_without_tool_call(client: openai.OpenAI) -> None:
    res = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "say hello world with python"}],
        tools=[TOOL],  # type: ignore[list-item]
        tool_choice="none",
        max_tokens=16,
    )
    choice = res.choices[0]
    assert not choice.message.tool_calls and choice.finish_reason == "length"


def test_streamed_tool_call_matches_the_whole_one(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Write a hello world in python"}],
        tools=[TOOL],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=200,
        stream=True,
    )
    name = arguments = ""
    finish = None
    ids = set()
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for call in choice.delta.tool_calls or []:
            assert call.index == 0
            if call.id:
                ids.add(call.id)
            if call.function and call.function.name:
                name += call.function.name
            if call.function and call.function.arguments:
                arguments += call.function.arguments
    assert finish == "tool_calls" and name == "python" and len(ids) == 1
    assert isinstance(json.loads(arguments)["code"], str)


@pytest.mark.parametrize(
    "tools",
    [
        [{"type": "function", "function": {"name": "bad name!", "parameters": {}}}],
        [{"type": "function"}],
        "not a list",
    ],
)
def test_invalid_tools_are_400(box: Served, key: str, tools: Any) -> None:
    res = post(box, key, "/chat/completions", {"messages": BOOK, "tools": tools})
    assert res.status_code == 400, res.text
    assert res.json()["error"]["type"] == "invalid_request_error"
