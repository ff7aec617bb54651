"""The OpenAI API's parameters beyond sampling, with the official client on the tiny model:
n, logprobs, response_format, tools (streamed), penalties, logit_bias, and refusals."""

from __future__ import annotations

import json
import threading
from typing import Any

import openai
import pytest
from litestar.testing import TestClient

from chatbox.chat.stateless import structured
from tests.conftest import LiveServer, client_for

USER = [{"role": "user", "content": "hello"}]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}


def test_n_returns_that_many_choices(shared_live: LiveServer) -> None:
    reply = client_for(shared_live).chat.completions.create(
        model="tiny", messages=USER, n=4, max_tokens=6, temperature=1.0, seed=2
    )
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert reply.usage is not None and reply.usage.completion_tokens == 24


def test_logprobs_are_sorted_and_hold_the_sampled_token(shared_live: LiveServer) -> None:
    reply = client_for(shared_live).chat.completions.create(
        model="tiny", messages=USER, max_tokens=12, logprobs=True, top_logprobs=5, seed=4
    )
    content = reply.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 12
    assert "".join(t.token for t in content) == reply.choices[0].message.content
    for t in content:
        assert t.logprob <= 0
        tops = [x.logprob for x in t.top_logprobs]
        assert len(tops) == 5 and tops == sorted(tops, reverse=True)
        if t.logprob > tops[-1]:
            assert t.token in [x.token for x in t.top_logprobs]


def test_streamed_tool_call_arguments_reassemble_to_valid_json(shared_live: LiveServer) -> None:
    stream = client_for(shared_live).chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "weather in Oslo?"}],
        tools=[TOOL],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,  # one call (the tiny model may otherwise make two)
        max_tokens=200,
        stream=True,
    )
    args: dict[int, str] = {}
    names: dict[int, str] = {}
    pieces = 0
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or []:
                if call.function and call.function.name:
                    names[call.index] = call.function.name
                if call.function and call.function.arguments:
                    args[call.index] = args.get(call.index, "") + call.function.arguments
                    pieces += 1
    assert names == {0: "get_weather"} and finish == "tool_calls"
    assert pieces > 1  # the arguments came in pieces, as they were generated
    parsed = json.loads(args[0])
    assert set(parsed) == {"city", "unit"} and parsed["unit"] in ("c", "f")


def test_a_json_schema_answer_validates(shared_live: LiveServer) -> None:
    schema = {
        "type": "object",
        "properties": {
            "colour": {"type": "string", "enum": ["red", "green"]},
            "count": {"type": "integer"},
        },
        "required": ["colour", "count"],
        "additionalProperties": False,
    }
    reply = client_for(shared_live).chat.completions.create(
        model="tiny",
        messages=USER,
        max_tokens=100,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "thing", "schema": schema, "strict": True},
        },
    )
    value = json.loads(reply.choices[0].message.content or "")
    assert value["colour"] in ("red", "green") and isinstance(value["count"], int)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"store": True}, "store"),
        ({"n": 9}, "n"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ],
)
def test_unsupported_and_invalid_parameters_are_400_naming_them(
    shared_live: LiveServer, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client_for(shared_live).chat.completions.create(
            model="tiny", messages=USER, max_tokens=2, extra_body=extra
        )
    assert e.value.status_code == 400
    assert isinstance(e.value.body, dict) and e.value.body.get("param") == param


def test_image_parts_are_refused_clearly(shared_live: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client_for(shared_live).chat.completions.create(
            model="tiny",
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
                    ],
                }
            ],
        )
    assert "image" in str(e.value) and "messages[0].content[1]" in str(e.value)


def test_unknown_parameters_are_ignored_and_known_defaults_accepted(
    shared_live: LiveServer,
) -> None:
    reply = client_for(shared_live).chat.completions.create(
        model="tiny",
        messages=USER,
        max_tokens=3,
        user="someone",
        presence_penalty=0.5,
        frequency_penalty=0.5,
        logit_bias={"5": -100},
        store=False,
        extra_body={"made_up_option": 1, "service_tier": "auto"},
    )
    assert reply.choices[0].finish_reason == "length"


def test_a_request_without_a_grammar_is_not_queued_behind_grammar_builds(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While every grammar-building thread is busy, a request with nothing to build (no tools,
    no response_format) is still answered; one with a schema waits and is refused (503)."""
    monkeypatch.setattr(structured, "BUILD_TIMEOUT_S", 0.5)
    release = threading.Event()
    busy = [structured._BUILDERS.submit(release.wait) for _ in range(2)]
    try:
        plain = {"model": "tiny", "messages": USER, "max_tokens": 4, "temperature": 0}
        assert client.post("/v1/chat/completions", json=plain).status_code == 200
        schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
        shaped = client.post("/v1/chat/completions", json={**plain, "response_format": schema})
        assert shaped.status_code == 503
    finally:
        release.set()
        for job in busy:
            job.result()
