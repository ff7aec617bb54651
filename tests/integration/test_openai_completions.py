"""`/v1/completions` and parallel tool calls on `chatbox serve`, with the official `openai`
client, on the tiny model (it never ends an answer by itself: answers run to max_tokens)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import openai_client
from tests.served import Served
from tests.tinymodel import SPECIAL_TOKENS, tiny_vocab

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "minLength": 3, "maxLength": 8}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
CITIES = [{"role": "user", "content": "What is the weather in Paris and in London?"}]
# The tiny model scripted to call again: its end tokens banned, so after a call only the
# next call can follow (the grammar allows nothing else) until max_tokens cuts the answer;
# its random city names never repeat a call (a repeated call ends the answer).
NO_END = {str(tiny_vocab()[0].index(t)): -100 for t in SPECIAL_TOKENS}


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Served]:
    with Served(tmp_path_factory.mktemp("completions"), model=tiny_gguf) as served:
        yield served


@pytest.fixture(scope="module")
def client(box: Served) -> openai.OpenAI:
    return openai_client(box.url, box.user("ann", tier="paid"))


# -- /v1/completions ----------------------------------------------------------------------


def test_a_text_completion_answers_the_raw_prompt(client: openai.OpenAI) -> None:
    prompt = "Once upon a time"
    reply = client.completions.create(model="tiny", prompt=prompt, max_tokens=5, seed=1)
    assert reply.object == "text_completion" and reply.id.startswith("cmpl-")
    assert reply.system_fingerprint and reply.model == "tiny"
    [choice] = reply.choices
    assert choice.index == 0 and choice.finish_reason == "length" and choice.text
    assert reply.usage is not None and reply.usage.completion_tokens == 5
    # No chat template around it: the prompt is its own bytes' tokens and a BOS at most.
    assert reply.usage.prompt_tokens <= len(prompt.encode()) + 1


def test_several_prompts_with_n_give_every_choice_in_order(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model="tiny", prompt=["one", "two"], n=2, max_tokens=3, temperature=1.0, seed=5
    )
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert reply.usage is not None and reply.usage.completion_tokens == 12


def test_a_streamed_text_completion_ends_with_usage(client: openai.OpenAI) -> None:
    stream = client.completions.create(
        model="tiny",
        prompt="The sky is",
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        seed=2,
    )
    chunks = list(stream)
    assert {c.object for c in chunks} == {"text_completion"}
    assert all(c.system_fingerprint for c in chunks)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] == "length" and not any(finish[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6
    whole = client.completions.create(model="tiny", prompt="The sky is", max_tokens=6, seed=2)
    assert text == whole.choices[0].text  # the same seed: the same answer, streamed or not


def test_text_completion_logprobs_and_stop(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model="tiny", prompt="abc", max_tokens=8, logprobs=2, seed=3, temperature=1.0
    )
    lp = reply.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs
    assert "".join(lp.tokens) == reply.choices[0].text
    assert all(p <= 0 for p in lp.token_logprobs)
    # two alternatives each (one key, where both are bytes of a character not yet whole)
    assert all(1 <= len(t) <= 2 for t in lp.top_logprobs) and any(
        len(t) == 2 for t in lp.top_logprobs
    )
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    cut = reply.choices[0].text[2:4]
    stopped = client.completions.create(
        model="tiny", prompt="abc", max_tokens=8, seed=3, temperature=1.0, stop=[cut]
    )
    assert cut not in stopped.choices[0].text and stopped.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"suffix": "and then"}, "suffix"),
        ({"echo": True}, "echo"),
        ({"logprobs": 6}, "logprobs"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"n": 9}, "n"),
        ({"prompt": [1, 2, 3]}, "prompt"),  # token ids: docs/openai.md says why not
        ({"prompt": []}, "prompt"),
    ],
)
def test_what_chatbox_does_not_do_is_400_naming_it(
    client: openai.OpenAI, extra: dict[str, Any], param: str
) -> None:
    body: dict[str, Any] = {"model": "tiny", "prompt": "x", "max_tokens": 2, **extra}
    with pytest.raises(openai.BadRequestError) as e:
        client.post("/completions", body=body, cast_to=httpx.Response)
    assert isinstance(e.value.body, dict) and e.value.body["param"] == param


def test_a_prompt_longer_than_the_context_is_context_length_exceeded(
    client: openai.OpenAI,
) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="word " * 20_000, max_tokens=2)
    assert e.value.code == "context_length_exceeded"
    assert isinstance(e.value.body, dict) and e.value.body["param"] == "prompt"


# -- parallel tool calls ------------------------------------------------------------------


def ask_for_calls(client: openai.OpenAI, **more: Any) -> Any:
    """The cities question, the tiny model scripted to call again (see NO_END)."""
    return client.chat.completions.create(
        model="tiny",
        messages=CITIES,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        max_tokens=300,
        seed=3,
        temperature=1.0,
        logit_bias=NO_END,
        **more,
    )


def test_the_answer_may_hold_several_tool_calls(client: openai.OpenAI) -> None:
    reply = ask_for_calls(client)
    calls = reply.choices[0].message.tool_calls or []
    assert len(calls) >= 2, reply
    assert len({c.id for c in calls}) == len(calls)
    for call in calls[:2]:  # the last may be cut by max_tokens
        assert call.function.name == "get_weather"  # type: ignore[union-attr]
        assert isinstance(json.loads(call.function.arguments)["city"], str)  # type: ignore[union-attr]


def test_streamed_parallel_calls_carry_their_index(client: openai.OpenAI) -> None:
    stream = ask_for_calls(client, stream=True)
    ids: dict[int, str] = {}
    args: dict[int, str] = {}
    for chunk in stream:
        for call in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            if call.id:
                ids[call.index] = call.id
            if call.function and call.function.arguments:
                args[call.index] = args.get(call.index, "") + call.function.arguments
    assert sorted(ids)[:2] == [0, 1] and len(set(ids.values())) == len(ids)
    assert all(not a.startswith(" ") for a in args.values())
    assert json.loads(args[0]) and json.loads(args[1])


def test_parallel_tool_calls_false_gives_exactly_one(client: openai.OpenAI) -> None:
    reply = ask_for_calls(client, parallel_tool_calls=False)
    choice = reply.choices[0]
    assert len(choice.message.tool_calls or []) == 1 and choice.finish_reason == "tool_calls"


def test_several_tool_results_come_back_in_one_request(client: openai.OpenAI) -> None:
    calls = [
        {
            "id": f"call_{city}",
            "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
        }
        for city in ("Paris", "London")
    ]
    messages: list[dict[str, Any]] = [
        *CITIES,
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_Paris", "content": "Sunny, 24 C"},
        {"role": "tool", "tool_call_id": "call_London", "content": "Rain, 14 C"},
    ]
    reply = client.chat.completions.create(
        model="tiny",
        messages=messages,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="none",
        max_tokens=4,
    )
    assert reply.choices[0].message.content and not reply.choices[0].message.tool_calls
    assert reply.usage is not None and reply.usage.prompt_tokens > 40


# -- LangChain ----------------------------------------------------------------------------


def test_langchain_raises_context_overflow_on_a_prompt_too_long(box: Served) -> None:
    """LangChain's trimming and fallbacks catch ContextOverflowError: OpenAI's 400
    `context_length_exceeded` is what they read it from."""
    from langchain_core.exceptions import ContextOverflowError
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(
        model="tiny",
        base_url=box.url + "/v1",
        api_key=box.user("bob", tier="paid"),  # type: ignore[arg-type]
        max_retries=0,
        max_completion_tokens=4,
    )
    assert chat.invoke("hello").content  # the same client answers a prompt that fits
    with pytest.raises(ContextOverflowError):
        chat.invoke("word " * 20_000)


# -- litellm ------------------------------------------------------------------------------


def test_litellm_raises_context_window_exceeded_on_a_prompt_too_long(
    box: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """litellm's fallbacks catch ContextWindowExceededError, read from the same 400 and code."""
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download at import
    import litellm

    key = box.user("cat", tier="paid")
    common: dict[str, Any] = {
        "model": "openai/tiny",
        "api_base": box.url + "/v1",
        "api_key": key,
        "max_tokens": 4,
        "num_retries": 0,
    }
    reply = litellm.completion(messages=[{"role": "user", "content": "hello"}], **common)
    assert reply.choices[0].message.content  # the same client answers a prompt that fits
    with pytest.raises(litellm.ContextWindowExceededError):
        litellm.completion(messages=[{"role": "user", "content": "word " * 20_000}], **common)


# -- LlamaIndex ---------------------------------------------------------------------------

# LlamaIndex pins an older `openai` than the suite's, so it runs from its own environment
# (scripts/setup.sh --test makes it from requirements-clients.lock).
CLIENTS_PYTHON = Path(__file__).resolve().parents[2] / ".venv-clients" / "bin" / "python"


def test_llamaindex_openai_like_with_default_settings_answers(box: Served) -> None:
    """`OpenAILike` defaults to a completion model: `complete` and `stream_complete` call
    /v1/completions, and both answer."""
    assert CLIENTS_PYTHON.exists(), "run scripts/setup.sh --test (it makes .venv-clients)"
    script = Path(__file__).resolve().parents[1] / "clients" / "llamaindex_complete.py"
    key = box.user("dan", tier="paid")
    done = subprocess.run(
        [str(CLIENTS_PYTHON), str(script), box.url + "/v1", key, "tiny", "Once upon a time"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["object"] == "text_completion"
    assert got["text"] and got["streamed"]
