"""The one error map: chat, knowledge and HTTP errors as responses with one JSON body shape.

Every API error is `{"error": {"message", "type", ...}}` (OpenAI's shape, so its client
raises the matching error class). The conversation API answers invalid input with 422; the
OpenAI-compatible endpoints answer as OpenAI's API does, 400 `invalid_request_error` naming
the parameter. A failure on the server's side is a 5xx on both. The HTML UI takes its
statuses from `classify` too, and only words the message for a person (`chatbox.web.ui`).
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

log = logging.getLogger("chatbox.web")
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
        (503, "Overloaded (Retry-After)"),
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
    if problem.status >= 500 and not isinstance(exc, HTTPException | ChatError):
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return problem


def api_error_handler(request: AnyRequest, exc: Exception) -> Response[Any]:
    """The conversation and knowledge APIs: 422 for invalid input."""
    return _respond(_logged(request, exc, classify(exc)))


def openai_error_handler(request: AnyRequest, exc: Exception) -> Response[Any]:
    """The OpenAI-compatible endpoints: invalid input is 400 `invalid_request_error`."""
    problem = _logged(request, exc, classify(exc))
    if problem.status == 422 or isinstance(exc, ValidationException):
        problem.status, problem.kind = 400, "invalid_request_error"
        if isinstance(exc, ValidationException) and "param" not in problem.extra:
            problem.extra["param"] = _first_param(exc)
    return _respond(problem)


def _first_param(exc: ValidationException) -> str | None:
    """The field a validation error names (Litestar puts `key` in each extra item)."""
    for item in exc.extra if isinstance(exc.extra, list) else []:
        if isinstance(item, dict) and item.get("key"):
            return str(item["key"])
    return None


_HANDLED = (ChatError, KnowledgeError, EmbeddingUnavailable, HTTPException, Exception)
EXCEPTION_HANDLERS: ExceptionHandlersMap = {cls: api_error_handler for cls in _HANDLED}
OPENAI_EXCEPTION_HANDLERS: ExceptionHandlersMap = {cls: openai_error_handler for cls in _HANDLED}
