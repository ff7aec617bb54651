"""OpenAI's Responses API on `chatbox serve`, through the official `openai` client: answers,
the streamed events, a forced function call, structured output, previous_response_id, and
kept responses that only their owner reads (and nothing kept under zero retention). Also
LangChain's `OpenAIEmbeddings` as it comes, which sends token ids."""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import openai
import pytest
from pydantic import BaseModel

from tests.served import Served

# litellm ships tiktoken's cl100k_base file: where LangChain (the client) reads it without
# fetching it. The server reads the file the app ships.
# Found, not imported: importing litellm tries to download its price list (~17 s offline).
_LITELLM = importlib.util.find_spec("litellm")
assert _LITELLM is not None and _LITELLM.origin is not None, "pip install litellm"
TIKTOKEN = Path(_LITELLM.origin).parent / "litellm_core_utils" / "tokenizers"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city now.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


class Pump(BaseModel):
    kind: Literal["rotary", "piston"]
    litres: int


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Served]:
    where = tmp_path_factory.mktemp("responses")
    # An empty tiktoken cache, as on a fresh box without internet.
    (where / "tiktoken").mkdir()
    env = {"TIKTOKEN_CACHE_DIR": str(where / "tiktoken")}
    with Served(where, model=tiny_gguf, env=env) as served:
        yield served


def client(box: Served, name: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=box.url + "/v1", api_key=box.user(name, tier="paid"), max_retries=0
    )


@pytest.fixture(scope="module")
def ann(box: Served) -> openai.OpenAI:
    return client(box, "ann")


def test_a_response_answers_with_its_text_and_usage(ann: openai.OpenAI) -> None:
    r = ann.responses.create(model="tiny", input="Hello there", max_output_tokens=8)
    assert r.id.startswith("resp_") and r.object == "response"
    assert [item.type for item in r.output] == ["message"]
    assert r.output_text == r.output[0].content[0].text  # type: ignore[union-attr]
    assert r.usage is not None and r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.usage.input_tokens_details.cached_tokens >= 0
    if r.status == "incomplete":  # the tiny model rarely ends on its own
        assert r.incomplete_details is not None
        assert r.incomplete_details.reason == "max_output_tokens"
        assert r.usage.output_tokens == 8
    else:
        assert r.status == "completed"
    told = ann.responses.create(
        model="tiny",
        instructions="Answer like a pirate, in one short sentence.",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Hello there"}]}],
        max_output_tokens=2,
    )
    assert told.instructions and told.usage and told.usage.input_tokens > r.usage.input_tokens


def test_a_streamed_response_sends_the_documented_events(ann: openai.OpenAI) -> None:
    events = list(ann.responses.create(model="tiny", input="Hi", max_output_tokens=6, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert kinds[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete")
    final = last.response  # type: ignore[union-attr]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.output_text == text and final.usage and final.usage.output_tokens > 0
    assert final.id == events[0].response.id  # type: ignore[union-attr]
    assert ann.responses.retrieve(final.id).output_text == text


def test_a_structured_answer_parses_into_the_model_streamed_or_not(ann: openai.OpenAI) -> None:
    parsed = ann.responses.parse(
        model="tiny", input="Describe a pump as JSON.", text_format=Pump, max_output_tokens=120
    )
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, Pump)
    with ann.responses.stream(
        model="tiny", input="Describe a pump as JSON.", text_format=Pump, max_output_tokens=120
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert isinstance(final.output_parsed, Pump)
    loose = ann.responses.create(
        model="tiny",
        input="Any JSON object.",
        text={"format": {"type": "json_object"}},
        max_output_tokens=60,
    )
    if loose.status == "completed":
        assert isinstance(json.loads(loose.output_text), dict)


def test_a_required_tool_call_is_a_function_call_item(ann: openai.OpenAI) -> None:
    r = ann.responses.create(
        model="tiny",
        input="What is the weather in Oslo?",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=200,
    )
    calls = [item for item in r.output if item.type == "function_call"]
    assert r.status == "completed" and len(calls) == 1
    call = calls[0]
    assert call.name == "get_weather" and call.call_id and call.id.startswith("fc_")
    assert isinstance(json.loads(call.arguments)["city"], str)
    answered = ann.responses.create(
        model="tiny",
        previous_response_id=r.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=[WEATHER],  # type: ignore[list-item]
        max_output_tokens=4,
    )
    assert answered.previous_response_id == r.id
    assert answered.usage and r.usage and answered.usage.input_tokens > r.usage.input_tokens
    # Streamed: the call's arguments arrive in deltas, then whole.
    events = list(
        ann.responses.create(
            model="tiny",
            input="Weather in Rome?",
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice={"type": "function", "name": "get_weather"},
            max_output_tokens=200,
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
    whole = next(e for e in events if e.type == "response.function_call_arguments.done")
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert "".join(pieces) == whole.arguments  # type: ignore[union-attr]
    assert isinstance(json.loads(whole.arguments)["city"], str)  # type: ignore[union-attr]


def test_previous_response_id_continues_and_only_the_owner_reads_a_response(
    box: Served, ann: openai.OpenAI
) -> None:
    first = ann.responses.create(model="tiny", input="My code word is plover.", max_output_tokens=4)
    second = ann.responses.create(
        model="tiny", previous_response_id=first.id, input="What was it?", max_output_tokens=4
    )
    assert first.usage and second.usage
    assert second.usage.input_tokens >= first.usage.input_tokens + first.usage.output_tokens
    kept = ann.responses.retrieve(second.id)
    assert (kept.id, kept.output_text) == (second.id, second.output_text)

    bob = client(box, "bob")
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.create(model="tiny", previous_response_id=first.id, input="And?")
    with pytest.raises(openai.NotFoundError):
        bob.responses.delete(first.id)
    ann.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError) as gone:
        ann.responses.retrieve(first.id)
    assert gone.value.body and gone.value.body["type"] == "not_found_error"  # type: ignore[index]

    unkept = ann.responses.create(model="tiny", input="Forget this.", store=False)
    assert unkept.store is False
    with pytest.raises(openai.NotFoundError):
        ann.responses.retrieve(unkept.id)


def test_zero_retention_keeps_no_response(box: Served) -> None:
    key = box.user("zed", tier="paid")
    r = httpx.patch(
        box.url + "/v1/users/me/retention",
        json={"zero_retention": True},
        headers=box.auth(key),
        timeout=60,
    )
    assert r.status_code == 200, r.text
    zed = openai.OpenAI(base_url=box.url + "/v1", api_key=key, max_retries=0)
    word = "quokkamarmalade"
    answer = zed.responses.create(model="tiny", input=f"Remember {word}", max_output_tokens=4)
    assert answer.store is False
    with pytest.raises(openai.NotFoundError):
        zed.responses.retrieve(answer.id)
    with pytest.raises(openai.BadRequestError) as refused:
        zed.responses.create(model="tiny", previous_response_id=answer.id, input="And?")
    assert refused.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert box.holding(word) == []


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "name": "bad name!"}]}, "tools[0].name"),
        ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
    ],
)
def test_an_invalid_request_is_400_naming_the_parameter(
    ann: openai.OpenAI, extra: dict[str, Any], param: str
) -> None:
    body = {"model": "tiny", "input": "hi", **extra}
    with pytest.raises(openai.BadRequestError) as e:
        ann.responses.create(**body)
    error = e.value.body
    assert isinstance(error, dict) and {"message", "type", "param", "code"} <= set(error)
    assert (error["type"], error["param"]) == ("invalid_request_error", param)


def test_langchain_embeddings_as_they_come_send_token_ids_that_embed_as_the_text(
    box: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    from langchain_openai import OpenAIEmbeddings

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(TIKTOKEN))
    key = box.user("lena", tier="paid")
    texts = ["Descale the kettle with citric acid.", "The pump needs a new seal."]
    embedder = OpenAIEmbeddings(
        base_url=box.url + "/v1",
        api_key=key,
        model="all-MiniLM-L6-v2",  # type: ignore[arg-type]
    )
    got = embedder.embed_documents(texts)
    plain = openai.OpenAI(base_url=box.url + "/v1", api_key=key).embeddings.create(
        model="all-MiniLM-L6-v2", input=texts
    )
    for mine, theirs in zip(got, plain.data, strict=True):
        cosine = sum(a * b for a, b in zip(mine, theirs.embedding, strict=True))
        assert math.isclose(cosine, 1.0, abs_tol=1e-4)
    # The ids themselves, as a list and as a list of lists, through the plain client.
    one = openai.OpenAI(base_url=box.url + "/v1", api_key=key).embeddings.create(
        model="all-MiniLM-L6-v2",
        input=[9906, 1917],  # "Hello world" in cl100k_base
    )
    assert len(one.data) == 1 and len(one.data[0].embedding) == 384
    with pytest.raises(openai.BadRequestError) as e:
        openai.OpenAI(base_url=box.url + "/v1", api_key=key, max_retries=0).embeddings.create(
            model="all-MiniLM-L6-v2",
            input=[[1, 2], ["x"]],  # type: ignore[list-item]
        )
    assert e.value.body["param"] == "input"  # type: ignore[index]
