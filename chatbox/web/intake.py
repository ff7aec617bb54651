"""What every request must be before a handler reads it: ids that fit SQLite's 64-bit
integers, booleans that are booleans, and JSON bodies of exactly the declared types, nested
no deeper than a fixed limit (checked on the raw bytes before anything decodes them, so no
decoder or walker of the value can run out of stack).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, get_args

import msgspec
import numpy as np
from litestar import Request
from litestar.enums import RequestEncodingType
from litestar.params import BodyKwarg, KwargDefinition, Parameter
from msgspec import Meta

from chatbox.web.errors import InvalidBody

# Ids are integers JSON carries exactly (2^53 - 1), well within SQLite's signed 64 bits.
MAX_ID = 2**53 - 1
MAX_JSON_DEPTH = 64  # objects and arrays inside one another in a request body

# An integer id in a path or query: a 400 outside 1..MAX_ID, documented as such.
PositiveId64 = Annotated[int, Parameter(ge=1, le=MAX_ID)]

# A list with at least one item: enforced by the strict decode, documented as minItems.
NonEmptyStrings = Annotated[list[str], Meta(min_length=1), KwargDefinition(min_items=1)]
NonEmptyObjects = Annotated[list[dict[str, Any]], Meta(min_length=1), KwargDefinition(min_items=1)]
NonEmptyText = Annotated[str, Meta(min_length=1), KwargDefinition(min_length=1)]

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_FORMS = ("multipart/form-data", "application/x-www-form-urlencoded")


def json_depth(body: bytes) -> int:
    """How deeply arrays and objects nest in `body` (brackets inside strings do not count;
    a malformed body may be over-counted, which only refuses it sooner)."""
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    codes = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1)
    return int(np.cumsum(steps, dtype=np.int64).max(initial=0))


async def check_request(request: Request[Any, Any, Any]) -> None:
    """A `before_request` hook (after authentication, before parameters and body are read):
    boolean query parameters are `true` or `false`; a JSON body nests at most MAX_JSON_DEPTH
    levels and has exactly the types its schema says (Litestar's own conversion is lenient:
    it would take `0` for a boolean, and it answers some type errors with a 500)."""
    handler = request.route_handler
    params = handler.parsed_fn_signature.parameters
    for name, value in request.query_params.items():
        if name in params and _is_bool(params[name].annotation) and value not in ("true", "false"):
            raise InvalidBody(f"{name} must be true or false; got {value!r}", name)
    data = params.get("data")
    if data is None or handler.resolve_request_max_body_size() is None:
        return  # no body, or a streamed upload that reads its own
    kind = data.kwarg_definition
    if request.content_type[0] in _FORMS or (
        isinstance(kind, BodyKwarg) and kind.media_type != RequestEncodingType.JSON
    ):
        return  # a form, parsed by its own rules
    body = await request.body()  # within the route's size cap; kept for the decoder
    opening = body.count(b"[") + body.count(b"{")
    if opening > MAX_JSON_DEPTH and json_depth(body) > MAX_JSON_DEPTH:
        raise InvalidBody(
            f"the JSON body nests arrays and objects more than {MAX_JSON_DEPTH} levels deep; "
            f"the limit is {MAX_JSON_DEPTH}",
            None,
        )
    if not body.strip() and data.is_optional:
        return
    try:
        msgspec.json.decode(body, type=data.annotation, strict=True)
    except msgspec.ValidationError as exc:
        raise InvalidBody(*_sentence(str(exc))) from exc
    except msgspec.DecodeError as exc:
        raise InvalidBody(f"the request body is not valid JSON: {exc}", None) from exc


def _is_bool(annotation: Any) -> bool:
    return annotation is bool or (
        bool in get_args(annotation) and set(get_args(annotation)) <= {bool, type(None)}
    )


def _where(message: str) -> str | None:
    """The body field a msgspec error names (`... - at `$.messages[0].role``)."""
    found = re.search(r"at `\$\.?([^`]*)`", message)
    return found.group(1) or None if found else None


def _sentence(message: str) -> tuple[str, str | None]:
    """A msgspec error as a sentence naming the field, and that field."""
    where = _where(message)
    what = message.split(" - at `")[0].replace("`", "")
    missing = re.fullmatch(r"Object missing required field (\S+)", what)
    if missing:
        field = f"{where}.{missing.group(1)}" if where else missing.group(1)
        return f"{field} is required", field
    if where is None:
        return f"the request body is invalid: {what[:1].lower()}{what[1:]}", None
    return f"{where} is invalid: {what[:1].lower()}{what[1:]}", where
