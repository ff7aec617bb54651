"""The OpenAPI document names a typed body for every JSON answer of the API."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from litestar.testing import TestClient

from chatbox.app import create_app
from chatbox.catalog.registry import ModelRegistry
from chatbox.settings import Settings
from chatbox.web.openai.schemas import ChatCompletionOut, TextCompletionOut

# What a success may answer besides JSON: events, an export's zip, nothing (204).
NOT_JSON = {"text/event-stream", "application/zip"}


def _schema(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    return doc["components"]["schemas"][ref.rsplit("/", 1)[1]]  # type: ignore[no-any-return]


def untyped_bodies(doc: dict[str, Any]) -> list[str]:
    """Each success answer of the document that is JSON without named, typed fields."""
    found = []
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            successes = {s: r for s, r in op["responses"].items() if s.startswith("2")}
            if not successes:
                found.append(f"{method.upper()} {path}: no success response")
            for status, response in successes.items():
                content = response.get("content") or {}
                if not content:
                    if status != "204":
                        found.append(f"{method.upper()} {path} {status}: no body documented")
                    continue
                json_body = content.get("application/json")
                if json_body is None:
                    if not set(content) <= NOT_JSON:
                        found.append(f"{method.upper()} {path} {status}: {sorted(content)}")
                    continue
                schema = json_body.get("schema") or {}
                options = schema.get("oneOf") or schema.get("anyOf") or [schema]
                for option in options:
                    if not _schema(doc, option).get("properties"):
                        found.append(f"{method.upper()} {path} {status}: {schema}")
    return found


def test_every_json_answer_of_the_api_has_a_typed_schema(
    settings: Settings, registry: ModelRegistry
) -> None:
    doc = create_app(settings, registry).openapi_schema.to_schema()
    assert "/v1/conversations" in doc["paths"]
    assert not untyped_bodies(doc)
    read = doc["paths"]["/v1/conversations/{conv_id}"]["get"]["responses"]["200"]
    refs = {o["$ref"] for o in read["content"]["application/json"]["schema"]["anyOf"]}
    assert refs == {
        "#/components/schemas/ConversationViewOut",
        "#/components/schemas/TemporaryChatOut",
    }
    turn = doc["components"]["schemas"]["BranchTurnOut"]["properties"]
    assert {"id", "content", "usage", "siblings", "my_rating"} <= set(turn)


def test_the_check_finds_an_untyped_body() -> None:
    bare = {"additionalProperties": {}, "type": "object"}
    doc: dict[str, Any] = {
        "paths": {
            "/v1/x": {
                "get": {"responses": {"200": {"content": {"application/json": {"schema": bare}}}}}
            },
            "/v1/y": {"post": {"responses": {"200": {}}}},
            "/v1/z": {"delete": {"responses": {"204": {"description": "gone"}}}},
        },
        "components": {"schemas": {}},
    }
    assert untyped_bodies(doc) == [
        f"GET /v1/x 200: {bare}",
        "POST /v1/y 200: no body documented",
    ]


@pytest.mark.parametrize(
    ("path", "struct", "body"),
    [
        (
            "/v1/chat/completions",
            ChatCompletionOut,
            {
                "model": "tiny",
                "messages": [{"role": "user", "content": "hi"}],
                "logprobs": True,
                "top_logprobs": 2,
            },
        ),
        ("/v1/completions", TextCompletionOut, {"model": "tiny", "prompt": "hi", "logprobs": 2}),
    ],
)
def test_a_completion_is_the_shape_its_schema_documents(
    client: TestClient, path: str, struct: type[msgspec.Struct], body: dict[str, Any]
) -> None:
    answer = client.post(path, json={**body, "max_tokens": 4, "temperature": 0})
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert msgspec.to_builtins(msgspec.convert(data, struct)) == data  # no key left out
