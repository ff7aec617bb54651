"""Every error becomes a clear JSON body with the right status code."""

from __future__ import annotations

from typing import Any

from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException, ValidationException

from chatbox.chat import (
    Busy,
    ChatError,
    InvalidInput,
    NotFound,
    Overloaded,
    RateLimited,
    TooLong,
    UnknownModel,
)

_STATUS: list[tuple[type[ChatError], int, str]] = [
    (InvalidInput, 422, "invalid_request_error"),
    (TooLong, 413, "context_length_exceeded"),
    (UnknownModel, 404, "model_not_found"),
    (NotFound, 404, "not_found"),
    (Busy, 409, "conversation_busy"),
    (Overloaded, 503, "overloaded"),
    (RateLimited, 429, "rate_limit_exceeded"),
]


def error_body(message: str, kind: str, **extra: Any) -> dict[str, Any]:
    # The OpenAI shape, so its client raises the matching error class.
    return {"error": {"message": message, "type": kind, **extra}}


def chat_error_handler(_: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    assert isinstance(exc, ChatError)
    status, kind = 500, "server_error"
    for cls, code, name in _STATUS:
        if isinstance(exc, cls):
            status, kind = code, name
            break
    extra: dict[str, Any] = {}
    headers: dict[str, str] = {}
    if isinstance(exc, UnknownModel):
        extra["available"] = exc.available
    if isinstance(exc, TooLong):
        extra["limit"] = exc.limit
    if isinstance(exc, Overloaded):
        headers["Retry-After"] = str(exc.retry_after)
    if isinstance(exc, RateLimited):
        headers.update(exc.headers)
        extra["code"] = exc.kind
    return Response(error_body(str(exc), kind, **extra), status_code=status, headers=headers,
                    media_type=MediaType.JSON)


def http_error_handler(_: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    assert isinstance(exc, HTTPException)
    message = exc.detail
    if isinstance(exc, ValidationException) and exc.extra:
        message = f"{exc.detail}: {exc.extra}"
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    return Response(error_body(str(message), kind), status_code=exc.status_code,
                    headers=exc.headers or {}, media_type=MediaType.JSON)


EXCEPTION_HANDLERS = {ChatError: chat_error_handler, HTTPException: http_error_handler}
