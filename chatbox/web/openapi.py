"""The OpenAPI schema as the server really behaves: what Litestar cannot infer is set here
when the schema is first built (`describe`, on first use: building it costs more than the
rest of `create_app`), so /schema/openapi.json describes every route.

Litestar marks every request body required and cannot see a body a handler streams
itself (the uploads); the examples are what a client would send.
"""

from __future__ import annotations

from typing import Any, get_args

from litestar import Litestar
from litestar._openapi.plugin import OpenAPIPlugin
from litestar.openapi.spec import (
    OpenAPI,
    OpenAPIFormat,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Reference,
    RequestBody,
    Schema,
)
from litestar.response import Stream
from litestar.routes import HTTPRoute

# One realistic body per operation that takes one (the examples phase of a schema fuzzer
# sends these; a client developer reads them).
EXAMPLES: dict[tuple[str, str], Any] = {
    ("POST", "/v1/conversations"): {"title": "Descaling the pump", "system_prompt": None},
    ("PATCH", "/v1/conversations/{conv_id}"): {"title": "Pump maintenance"},
    ("POST", "/v1/conversations/{conv_id}/turns"): {
        "content": "How often should I descale the pump?",
        "max_tokens": 8,
    },
    ("POST", "/v1/conversations/{conv_id}/turns/{turn_id}/edit"): {
        "content": "How often should I descale it with citric acid?"
    },
    ("POST", "/v1/conversations/{conv_id}/turns/{turn_id}/regenerate"): {"temperature": 0.7},
    ("POST", "/v1/conversations/{conv_id}/branch"): {"turn_id": "t_0123456789abcdef"},
    ("POST", "/v1/conversations/{conv_id}/turns/{turn_id}/feedback"): {
        "rating": "down",
        "comment": "The descaling ratio was wrong.",
    },
    ("POST", "/v1/conversations/{conv_id}/tool-calls/{call_id}/approval"): {"allow": True},
    ("POST", "/v1/chat/completions"): {
        "model": "auto",
        "messages": [
            {"role": "system", "content": "Answer in one sentence."},
            {"role": "user", "content": "What is descaling?"},
        ],
        "max_tokens": 8,
        "temperature": 0.2,
    },
    ("POST", "/v1/completions"): {
        "model": "auto",
        "prompt": "Descaling a pump means",
        "max_tokens": 8,
        "temperature": 0.2,
    },
    ("POST", "/v1/responses"): {
        "model": "auto",
        "instructions": "Answer in one sentence.",
        "input": "What is descaling?",
        "max_output_tokens": 8,
    },
    ("POST", "/v1/embeddings"): {"input": ["citric acid", "descaling"], "model": None},
    ("POST", "/v1/moderations"): {"input": "Is this message fine?"},
    ("PATCH", "/v1/users/{user_id}/memory"): {"add": ["Prefers short answers"], "remove": []},
    ("PATCH", "/v1/users/me/retention"): {"zero_retention": False},
    ("POST", "/v1/users/me/delete"): {"confirm": "ann"},
    ("POST", "/v1/admin/replicas"): {"url": "http://10.0.0.2:8080", "kind": "chatbox"},
    ("POST", "/v1/admin/replicas/drain"): {"url": "http://10.0.0.2:8080", "undo": False},
    ("POST", "/v1/admin/shadow/start"): {"candidate": "gemma3-270m", "tier": "free", "percent": 5},
    ("POST", "/v1/admin/shadow/stop"): {"tier": "free"},
    ("POST", "/v1/admin/evals"): {
        "model": "gemma3-270m",
        "suite": {
            "name": "smoke",
            "cases": [
                {
                    "id": "capital-france",
                    "category": "factual",
                    "prompt": "What is the capital of France? Answer with one word.",
                    "max_tokens": 8,
                    "check": {"kind": "regex", "pattern": "(?i)\\bparis\\b"},
                }
            ],
        },
        "judge": None,
    },
    ("POST", "/v1/admin/moderation/{item_id}/resolve"): {"action": "dismiss"},
    ("POST", "/v1/conversations/{conv_id}/shares"): {},
    ("POST", "/v1/workspaces"): {"name": "Support team"},
    ("POST", "/v1/workspaces/{ws_id}/members"): {"name": "ann", "role": "member"},
    ("POST", "/v1/conversations/{conv_id}/workspace"): {"workspace_id": None},
}

# One server-sent event: `data` is a JSON document; `id` counts events for Last-Event-ID.
_EVENTS = OpenAPIMediaType(
    schema=Schema(
        type=OpenAPIType.OBJECT,
        description="Server-sent events, one JSON document in each event's data",
        properties={
            "event": Schema(type=OpenAPIType.STRING),
            "data": Schema(type=OpenAPIType.STRING),
            "id": Schema(type=OpenAPIType.STRING),
            "retry": Schema(type=OpenAPIType.INTEGER),
        },
    )
)
_FILE = Schema(type=OpenAPIType.STRING, format=OpenAPIFormat.BINARY, description="The file's bytes")


def _upload_body(with_conversation: bool) -> RequestBody:
    properties: dict[str, Schema | Reference] = {"file": _FILE}
    if with_conversation:
        properties["conversation_id"] = Schema(
            type=OpenAPIType.STRING, description="Attach the file to this conversation"
        )
    return RequestBody(
        required=True,
        description="multipart/form-data with the file in a field named `file`",
        content={
            "multipart/form-data": OpenAPIMediaType(
                schema=Schema(type=OpenAPIType.OBJECT, properties=properties, required=["file"])
            )
        },
    )


class _DescribedOpenAPIPlugin(OpenAPIPlugin):
    """Litestar's OpenAPI plugin, completing the schema as it first builds it."""

    __slots__ = ()

    def provide_openapi(self) -> OpenAPI:
        if not self._openapi:
            schema = self._build_openapi()
            _describe(self.app, schema)
            self._openapi = schema
        return self._openapi


def describe(app: Litestar) -> None:
    """Have the app's OpenAPI schema completed when it is first built (then served as is)."""
    app.plugins.get(OpenAPIPlugin).__class__ = _DescribedOpenAPIPlugin


def _describe(app: Litestar, schema: OpenAPI) -> None:
    paths = schema.paths or {}
    for route in app.routes:
        if not isinstance(route, HTTPRoute) or route.path_format not in paths:
            continue
        item = paths[route.path_format]
        for method, (handler, _) in route.route_handler_map.items():
            operation = getattr(item, method.lower(), None)
            if operation is None:
                continue
            _document_streams(handler.parsed_fn_signature.return_type.annotation, operation)
            _either_body(operation)
            data = handler.parsed_fn_signature.parameters.get("data")
            if handler.resolve_request_max_body_size() is None:  # reads its own multipart
                operation.request_body = _upload_body(route.path_format == "/v1/documents")
            elif data is not None and isinstance(operation.request_body, RequestBody):
                operation.request_body.required = not data.is_optional
                example = EXAMPLES.get((method, route.path_format))
                for media in (operation.request_body.content or {}).values():
                    if example is not None:
                        media.example = example


def _either_body(operation: Any) -> None:
    """A success body of one of several structs is `anyOf` them: Litestar writes `oneOf`,
    which a body valid under two (a temporary chat is a conversation with more fields)
    breaks."""
    for status, response in (operation.responses or {}).items():
        if not (isinstance(response, OpenAPIResponse) and status.startswith("2")):
            continue
        for media in (response.content or {}).values():
            schema = media.schema
            if isinstance(schema, Schema) and schema.one_of:
                schema.any_of, schema.one_of = schema.one_of, None


def _document_streams(returns: Any, operation: Any) -> None:
    """A handler that answers with server-sent events documents them as its success body
    (beside JSON where it answers either way, as /v1/chat/completions does with `stream`)."""
    options = get_args(returns) or (returns,)
    if Stream not in options:
        return
    for status, response in (operation.responses or {}).items():
        if isinstance(response, OpenAPIResponse) and status.startswith("2"):
            content = dict(response.content or {}) if len(options) > 1 else {}
            content["text/event-stream"] = _EVENTS
            response.content = content
