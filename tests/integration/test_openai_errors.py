"""OpenAI's error contract on `chatbox serve`: each kind of error reaches the official
`openai` client as the status, type, param and code OpenAI's API sends, so the client
raises the matching exception class and `e.code` says what went wrong."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from chatbox.chat.policy import default_policy_path
from tests.conftest import _answers_unchecked
from tests.served import Served

USER = [{"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Served]:
    """The shipped policy with the free tier at 2 requests a minute (the rate-limit test)."""
    where = tmp_path_factory.mktemp("openai-errors")
    text = default_policy_path().read_text()
    text = re.sub(r"(\[tiers\.free\][^\[]*?)rpm = \d+", r"\1rpm = 2", text, count=1)
    policy = where / "free-rpm-2.toml"
    policy.write_text(text)
    with Served(where, model=tiny_gguf, policy=_answers_unchecked(policy, where)) as served:
        yield served


@pytest.fixture(scope="module")
def client(box: Served) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=box.url + "/v1", api_key=box.user("ann", tier="paid"), max_retries=0
    )


def fields(e: openai.APIStatusError) -> dict[str, Any]:
    """The error object, which must carry all four of OpenAI's fields."""
    assert isinstance(e.body, dict), e.body
    assert {"message", "type", "param", "code"} <= set(e.body), e.body
    assert isinstance(e.body["message"], str) and e.body["message"]
    return e.body


def test_a_malformed_body_is_400_with_a_sentence_naming_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=USER, extra_body={"n": "two"})
    error = fields(e.value)
    assert (e.value.status_code, error["type"], error["param"]) == (
        400,
        "invalid_request_error",
        "n",
    )
    assert error["message"].startswith("n ") and "{" not in error["message"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": -1}, "max_completion_tokens"),
        ({"n": 0}, "n"),
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"top_logprobs": -1, "logprobs": True}, "top_logprobs"),
        ({"logit_bias": {"5": -101}}, "logit_bias"),
    ],
)
def test_a_number_out_of_range_is_400_naming_it(
    client: openai.OpenAI, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=USER, extra_body=extra)
    error = fields(e.value)
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert param in error["message"]


def test_a_bad_key_is_401_invalid_api_key(box: Served) -> None:
    bad = openai.OpenAI(base_url=box.url + "/v1", api_key="sk-not-a-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.models.list()
    error = fields(e.value)
    assert (e.value.status_code, e.value.code, error["type"]) == (
        401,
        "invalid_api_key",
        "invalid_request_error",
    )


def test_an_unknown_model_is_404_model_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no-such-model", messages=USER, max_tokens=2)
    error = fields(e.value)
    assert (e.value.code, error["type"], error["param"]) == (
        "model_not_found",
        "invalid_request_error",
        "model",
    )
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("no-such-model")
    assert e.value.code == "model_not_found" and fields(e.value)["param"] == "model"


def test_models_are_listed_and_retrieved_with_their_kind(client: openai.OpenAI) -> None:
    kinds = {
        m.id: (m.model_extra or {}).get("chatbox", {}).get("kind") for m in client.models.list()
    }
    assert kinds["tiny"] == "chat" and kinds["all-MiniLM-L6-v2"] == "embedding"
    model = client.models.retrieve("tiny")
    assert (model.id, model.object) == ("tiny", "model")
    assert client.models.retrieve("all-MiniLM-L6-v2").id == "all-MiniLM-L6-v2"


def test_embeddings_refuse_dimensions_they_cannot_serve(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="all-MiniLM-L6-v2", input="hello", dimensions=64)
    error = fields(e.value)
    assert (error["type"], error["param"]) == ("invalid_request_error", "dimensions")
    whole = client.embeddings.create(model="all-MiniLM-L6-v2", input="hello", dimensions=384)
    assert len(whole.data[0].embedding) == 384


def test_a_context_overflow_is_400_context_length_exceeded(client: openai.OpenAI) -> None:
    long = " ".join(f"word{i}" for i in range(3000))  # well over the 1024-token window
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": long}], max_tokens=2
        )
    error = fields(e.value)
    assert (e.value.code, error["type"], error["param"]) == (
        "context_length_exceeded",
        "invalid_request_error",
        "messages",
    )


def test_a_rate_limit_is_429_rate_limit_exceeded(box: Served) -> None:
    rita = openai.OpenAI(base_url=box.url + "/v1", api_key=box.user("rita"), max_retries=0)
    with pytest.raises(openai.RateLimitError) as e:
        for _ in range(3):  # the free tier here allows 2 a minute
            rita.chat.completions.create(model="tiny", messages=USER, max_tokens=1)
    error = fields(e.value)
    assert (e.value.status_code, e.value.code, error["type"]) == (
        429,
        "rate_limit_exceeded",
        "rate_limit_error",
    )
    assert int(e.value.response.headers["retry-after"]) >= 1


def test_system_only_messages_are_answered(client: openai.OpenAI) -> None:
    for role in ("system", "developer"):
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": role, "content": "Say hi."}], max_tokens=2
        )
        assert reply.choices and reply.system_fingerprint
