"""The one error map: chat, knowledge and HTTP errors as responses with one JSON body shape.

Every API error is `{"error": {"message", "type", ...}}` (OpenAI's shape, so its client
raises the matching error class). The conversation API answers invalid input with 422; the
OpenAI-compatible endpoints answer as OpenAI's API does (`as_openai`): all four of
`message`, `type`, `param` and `code`, invalid input as 400 `invalid_request_error` naming
the parameter. A failure on the server's side is a 5xx on both; a database that cannot be
reached is a 503 with `Retry-After` (logged in one line, not as a traceback). The HTML UI
takes its statuses from `classify` too, and only words the message for a person
(`chatbox.web.ui.helpers`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.openapi import ResponseSpec
from litestar.types import ExceptionHandlersMap

from chatbox.chat import (
    Busy,
    ChatError,
    Forbidden,
    GenerationFailed,
    InvalidInput,
    NotFound,
    Overloaded,
    RateLimited,
    Refused,
    TooLong,
    UnknownModel,
)
from chatbox.knowledge import (
    EmbeddingUnavailable,
    EmptyFile,
    EncryptedFile,
    FileTooLarge,
    KnowledgeError,
    NotFoundError,
    NotKept,
    RejectedFile,
    UnsupportedFile,
)
from chatbox.services import STORE_RETRY_AFTER_S, store_unreachable

log = logging.getLogger("chatbox.web")
STORE_UNAVAILABLE = "store_unavailable"  # the error type of a request the database's outage failed
AnyRequest = Request[Any, Any, Any]

# (error class, status, type) — the first match wins, so subclasses come first.
_STATUS: list[tuple[type[Exception], int, str]] = [
    (Refused, 400, "content_filter"),  # moderation: nothing stored, nothing run
    (InvalidInput, 422, "invalid_request_error"),
    (TooLong, 413, "context_length_exceeded"),
    (UnknownModel, 404, "model_not_found"),
    (NotFound, 404, "not_found"),
    (Forbidden, 403, "permission_denied"),
    (Busy, 409, "conversation_busy"),
    (Overloaded, 503, "overloaded"),
    (RateLimited, 429, "rate_limit_exceeded"),
    (GenerationFailed, 500, "server_error"),
    (NotFoundError, 404, "not_found"),
    (FileTooLarge, 413, FileTooLarge.reason),
    (UnsupportedFile, 415, UnsupportedFile.reason),
    (EncryptedFile, 422, EncryptedFile.reason),
    (EmptyFile, 422, EmptyFile.reason),
    (NotKept, 422, NotKept.reason),
    (RejectedFile, 422, RejectedFile.reason),
    (EmbeddingUnavailable, 503, "embeddings_unavailable"),
]


class InvalidBody(ValidationException):
    """A request that is not what the schema says (400), naming the parameter where one is
    to blame; raised before the handler runs (`chatbox.web.intake`)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class Problem:
    """What an exception means over HTTP."""

    status: int
    kind: str
    message: str
    extra: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


def classify(exc: Exception) -> Problem:
    """Status, error type, message, extra body fields and headers of an exception."""
    if isinstance(exc, HTTPException):
        message = str(exc.detail)
        if isinstance(exc, ValidationException) and exc.extra:
            message = f"{exc.detail}: {exc.extra}"
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        problem = Problem(exc.status_code, kind, message, headers=dict(exc.headers or {}))
        if isinstance(exc, InvalidBody) and exc.param:
            problem.extra["param"] = exc.param
        return problem
    if (reason := store_unreachable(exc)) is not None:
        return Problem(
            503,
            STORE_UNAVAILABLE,
            f"The database cannot be reached ({reason}); try again shortly.",
            headers={"Retry-After": str(STORE_RETRY_AFTER_S)},
        )
    if not isinstance(exc, ChatError | KnowledgeError | EmbeddingUnavailable):
        return Problem(500, "server_error", "internal server error")
    status, kind = next(
        ((code, name) for cls, code, name in _STATUS if isinstance(exc, cls)), (500, "server_error")
    )
    problem = Problem(status, kind, str(exc))
    if isinstance(exc, InvalidInput) and exc.param:
        problem.extra["param"] = exc.param
    if isinstance(exc, UnknownModel):
        problem.extra["available"] = exc.available
    if isinstance(exc, TooLong):
        problem.extra["limit"] = exc.limit
        if exc.param:
            problem.extra["param"] = exc.param
    if isinstance(exc, Overloaded):
        problem.headers["Retry-After"] = str(exc.retry_after)
    if isinstance(exc, Refused):
        problem.extra.update(code="content_filter", category=exc.category)
    if isinstance(exc, RateLimited):
        problem.headers.update(exc.headers)
        problem.extra["code"] = exc.kind
    return problem


@dataclass
class ErrorDetail:
    message: str
    type: str
    param: str | None = None
    code: str | None = None


@dataclass
class ErrorOut:
    """The JSON body of every API error (for the OpenAPI schema)."""

    error: ErrorDetail


# Route handlers list these so the schema documents the error body they actually send
# (`chatbox.web.document_errors` adds the ones a route can send on top of the common ones).
ERROR_RESPONSES = {
    status: ResponseSpec(data_container=ErrorOut, description=text)
    for status, text in (
        (400, "Invalid request (names the `param`)"),
        (401, "Missing or invalid credentials"),
        (403, "Not allowed: admins only, or a browser session without its CSRF token"),
        (404, "Not found, or not yours"),
        (429, "Rate limited (Retry-After)"),
        (500, "Server error"),
        (503, "Overloaded, or the database cannot be reached (Retry-After)"),
    )
}
MORE_RESPONSES = {
    status: ResponseSpec(data_container=ErrorOut, description=text)
    for status, text in (
        (409, "The conversation is busy with another answer"),
        (413, "Too large: the body, the upload or the message is over its limit (named)"),
        (415, "The file's type is not supported"),
        (422, "Invalid input (names the `param` where one is to blame)"),
    )
}


def error_body(message: str, kind: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, **extra}}


def _respond(problem: Problem) -> Response[Any]:
    return Response(
        error_body(problem.message, problem.kind, **problem.extra),
        status_code=problem.status,
        headers=problem.headers,
        media_type=MediaType.JSON,
    )


def _logged(request: AnyRequest, exc: Exception, problem: Problem) -> Problem:
    if problem.kind == STORE_UNAVAILABLE:  # an outage, not a bug: one line, no traceback
        log.warning("%s %s: 503, %s", request.method, request.url.path, problem.message)
    elif problem.status >= 500 and not isinstance(exc, HTTPException | ChatError):
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return problem


def api_error_handler(request: AnyRequest, exc: Exception) -> Response[Any]:
    """The conversation and knowledge APIs: 422 for invalid input."""
    return _respond(_logged(request, exc, classify(exc)))


def openai_error_handler(request: AnyRequest, exc: Exception) -> Response[Any]:
    """The OpenAI-compatible endpoints: OpenAI's statuses, types and codes (`as_openai`)."""
    return _respond(as_openai(exc, _logged(request, exc, classify(exc))))


# OpenAI's error type for each status; any other 4xx is an invalid request.
_OPENAI_TYPE = {
    401: "invalid_request_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}
_TYPES = {"invalid_request_error", "server_error", *_OPENAI_TYPE.values()}


def as_openai(exc: Exception, problem: Problem) -> Problem:
    """A problem as OpenAI's API words it: `{"message", "type", "param", "code"}`, every
    field present, so the `openai` client raises the matching class and `e.code` is set."""
    extra = problem.extra
    param, code = extra.pop("param", None), extra.pop("code", None)
    invalid = problem.status == 422 or isinstance(exc, ValidationException)
    status = 400 if invalid else problem.status
    kind = "server_error" if status >= 500 else _OPENAI_TYPE.get(status, "invalid_request_error")
    code = code or (problem.kind if problem.kind not in _TYPES else None)
    message = problem.message
    if isinstance(exc, ValidationException) and not isinstance(exc, InvalidBody):
        param, message = _validation_sentence(exc)
    elif isinstance(exc, TooLong):
        status, kind, code = 400, "invalid_request_error", "context_length_exceeded"
        param = param or "messages"
        # OpenAI's own sentence: litellm finds an overflow by its wording, LangChain by the
        # code in the text (the official client's exception text is the message alone).
        if exc.unit == "tokens":
            message = (
                f"This model's maximum context length is {exc.limit} tokens. However, your "
                f"{param} resulted in {exc.tokens} tokens. Please reduce the length of the "
                f"{param}."
            )
        message = f"{message} ({code})"
    elif isinstance(exc, UnknownModel):
        kind, code, param = "invalid_request_error", "model_not_found", "model"
    elif isinstance(exc, Refused):
        kind, code = "invalid_request_error", "content_filter"
    elif isinstance(exc, RateLimited):
        extra["limit"] = exc.kind
        code = "insufficient_quota" if exc.kind == "budget" else "rate_limit_exceeded"
    elif status == 401:
        code = "invalid_api_key"
    elif status == 404 and code == "not_found":
        code = None
    body = {"param": param, "code": code, **extra}
    return Problem(status, kind, message, body, problem.headers)


def _validation_sentence(exc: ValidationException) -> tuple[str | None, str]:
    """The parameter a schema error names, and a sentence saying what is wrong with it
    (Litestar puts `key` and `message` in each extra item)."""
    for item in exc.extra if isinstance(exc.extra, list) else []:
        if isinstance(item, dict) and item.get("key"):
            key, why = str(item["key"]), str(item.get("message") or "is invalid")
            if "missing required" in why.lower():
                return key, f"{key} is required."
            why = why.replace("`", "")
            return key, f"{key} is invalid: {why[:1].lower()}{why[1:]}."
    return None, f"The request body is invalid: {exc.detail}."


_HANDLED = (ChatError, KnowledgeError, EmbeddingUnavailable, HTTPException, Exception)
EXCEPTION_HANDLERS: ExceptionHandlersMap = {cls: api_error_handler for cls in _HANDLED}
OPENAI_EXCEPTION_HANDLERS: ExceptionHandlersMap = {cls: openai_error_handler for cls in _HANDLED}
