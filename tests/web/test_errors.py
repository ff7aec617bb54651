"""The one error map: one JSON body shape, 422 on the conversation API, 400 on OpenAI's."""

from __future__ import annotations

from typing import Any

import pytest
from litestar.testing import TestClient

from chatbox.chat import (
    Busy,
    Forbidden,
    GenerationFailed,
    InvalidInput,
    NotFound,
    Overloaded,
    RateLimited,
    TooLong,
    UnknownModel,
)
from chatbox.knowledge import FileTooLarge, NotFoundError, UnsupportedFile
from chatbox.web.errors import as_openai, classify


def error_of(response: Any) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    assert {"message", "type"} <= set(body["error"]), body
    return dict(body["error"])


@pytest.mark.parametrize(
    ("exc", "status", "kind"),
    [
        (InvalidInput("empty"), 422, "invalid_request_error"),
        (TooLong(5000, 4096), 413, "context_length_exceeded"),
        (Overloaded("full", 3), 503, "overloaded"),
        (RateLimited("slow down", 2), 429, "rate_limit_exceeded"),
        (GenerationFailed("decode failed"), 500, "server_error"),
        (NotFoundError("document not found"), 404, "not_found"),
        (FileTooLarge("too big"), 413, "file_too_large"),
        (UnsupportedFile("what is this"), 415, "unsupported_file"),
        (RuntimeError("a bug"), 500, "server_error"),
    ],
)
def test_each_error_has_one_status_and_type(exc: Exception, status: int, kind: str) -> None:
    problem = classify(exc)
    assert (problem.status, problem.kind) == (status, kind)


def test_a_bug_does_not_leak_its_message() -> None:
    assert classify(RuntimeError("secret path /root/x")).message == "internal server error"


def test_conversation_api_answers_invalid_input_with_422(client: TestClient) -> None:
    conv = client.post("/v1/conversations", json={}).json()["id"]
    response = client.post(f"/v1/conversations/{conv}/turns", json={"content": "  "})
    assert response.status_code == 422
    assert error_of(response)["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([{"role": "user", "content": [{"type": "text", "text": 1}]}], "messages[0].content[0]"),
        ([{"role": ["user"], "content": "hi"}], "messages[0].role"),
        ([{"role": "user", "content": {"text": "hi"}}], "messages[0].content"),
        (["hello"], "messages[0]"),
    ],
)
def test_openai_api_answers_invalid_input_with_400_naming_the_param(
    client: TestClient, messages: list[Any], param: str
) -> None:
    response = client.post("/v1/chat/completions", json={"model": "tiny", "messages": messages})
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert error["type"] == "invalid_request_error" and error["param"] == param


def test_openai_api_schema_errors_are_400_too(client: TestClient) -> None:
    response = client.post("/v1/chat/completions", json={"model": "tiny"})
    assert response.status_code == 400
    assert error_of(response)["type"] == "invalid_request_error"
    response = client.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "n": 9}
    )
    assert response.status_code == 400 and error_of(response)["param"] == "n"


def test_unknown_model_is_404_with_the_available_ones(client: TestClient) -> None:
    response = client.post(
        "/v1/chat/completions",
        json={"model": "nope", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 404
    error = error_of(response)
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "model_not_found",
        "model",
    )
    assert error["available"] == ["tiny"]


@pytest.mark.parametrize(
    ("exc", "status", "kind", "code", "param"),
    [
        (InvalidInput("n must be between 1 and 8", "n"), 400, "invalid_request_error", None, "n"),
        (TooLong(5000, 4096), 400, "invalid_request_error", "context_length_exceeded", "messages"),
        (UnknownModel("x", ["tiny"]), 404, "invalid_request_error", "model_not_found", "model"),
        (NotFound("no such thing"), 404, "not_found_error", None, None),
        (Forbidden("not yours to change"), 403, "permission_error", "permission_denied", None),
        (Busy("answering"), 409, "invalid_request_error", "conversation_busy", None),
        (RateLimited("slow down", 2), 429, "rate_limit_error", "rate_limit_exceeded", None),
        (
            RateLimited("spent", 9, kind="budget"),
            429,
            "rate_limit_error",
            "insufficient_quota",
            None,
        ),
        (Overloaded("full", 3), 503, "server_error", "overloaded", None),
        (RuntimeError("a bug"), 500, "server_error", None, None),
    ],
)
def test_openai_endpoints_word_each_error_as_openai_does(
    exc: Exception, status: int, kind: str, code: str | None, param: str | None
) -> None:
    problem = as_openai(exc, classify(exc))
    assert (problem.status, problem.kind) == (status, kind)
    assert (problem.extra["code"], problem.extra["param"]) == (code, param)
