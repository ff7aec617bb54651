"""Tools, structured output, logprobs and n with the official client on the real model."""

from __future__ import annotations

import json
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from tests.conftest import LiveServer, client_for

pytestmark = [
    pytest.mark.model,
    pytest.mark.store_agnostic("stateless completions: the model's calls, schemas and logprobs"),
]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "the city's name"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def test_tools_round_trip(real_server: LiveServer) -> None:
    client = client_for(real_server)
    messages: list[dict[str, object]] = [
        {"role": "user", "content": "What is the weather in Paris right now?"}
    ]
    first = client.chat.completions.create(
        model="smollm2",
        messages=messages,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        temperature=0,
        max_tokens=60,
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert len(calls) == 1 and calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    args = json.loads(calls[0].function.arguments)  # type: ignore[union-attr]
    assert isinstance(args["city"], str)
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append(
        {"role": "tool", "tool_call_id": calls[0].id, "content": "Sunny and 24 degrees Celsius."}
    )
    second = client.chat.completions.create(
        model="smollm2",
        messages=messages,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="none",
        temperature=0,
        max_tokens=40,
    )
    answer = second.choices[0].message.content or ""
    assert second.choices[0].finish_reason in ("stop", "length")
    assert not second.choices[0].message.tool_calls
    assert any(w in answer.lower() for w in ("sunny", "24", "degrees", "weather"))


def test_two_cities_ask_for_parallel_calls_of_the_right_shape(real_server: LiveServer) -> None:
    """With `parallel_tool_calls` on (the default), the grammar lets the default model answer
    a question about two cities with one call per city: two get_weather calls, each with
    its own id and JSON arguments, in one assistant message."""
    reply = client_for(real_server).chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "What is the weather in Paris and in London?"}],
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        temperature=0,
        max_tokens=200,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert len(calls) == 2, calls
    assert len({c.id for c in calls}) == len(calls)
    cities = []
    for call in calls:
        assert call.type == "function" and call.function.name == "get_weather"  # type: ignore[union-attr]
        arguments = call.function.arguments  # type: ignore[union-attr]
        assert arguments == arguments.strip()
        cities.append(json.loads(arguments)["city"])
    assert {c.lower() for c in cities} == {"paris", "london"}


class City(BaseModel):
    name: str = Field(max_length=40)
    country: str = Field(max_length=40)
    size: Literal["small", "medium", "large"]
    population_millions: float


def test_parse_with_a_pydantic_model(real_server: LiveServer) -> None:
    reply = client_for(real_server).chat.completions.parse(
        model="smollm2",
        messages=[{"role": "user", "content": "Describe the city of Tokyo."}],
        response_format=City,
        temperature=0,
        max_tokens=120,
    )
    city = reply.choices[0].message.parsed
    assert isinstance(city, City) and city.size in ("small", "medium", "large")


def test_logprobs_and_n_on_the_real_model(real_server: LiveServer) -> None:
    reply = client_for(real_server).chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Name a fruit."}],
        n=4,
        temperature=0.9,
        seed=3,
        max_tokens=8,
        logprobs=True,
        top_logprobs=3,
    )
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    for choice in reply.choices:
        content = choice.logprobs.content if choice.logprobs else None
        assert content
        for t in content:
            tops = [x.logprob for x in t.top_logprobs]
            assert t.logprob <= 0 and tops == sorted(tops, reverse=True)
            if t.logprob >= tops[-1]:
                assert t.token in [x.token for x in t.top_logprobs]
