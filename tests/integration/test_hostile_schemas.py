"""Schemas whose numbers would become a huge grammar (tools, response_format), sent to
`chatbox serve` as a member would: each is refused with a 400 naming the keyword, the
server's memory stays put, and another user's answer still arrives."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.served import Served

Body = dict[str, Any]


def fmt(schema: Body) -> Body:
    """A request whose answer must match `schema` (response_format json_schema)."""
    return {
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    }


def tool(parameters: Body) -> Body:
    """A request that must call one tool whose parameters are `parameters`."""
    fn = {"name": "f", "description": "", "parameters": parameters}
    return {"tools": [{"type": "function", "function": fn}], "tool_choice": "required"}


def one(prop: Body) -> Body:
    return {"type": "object", "properties": {"a": prop}, "required": ["a"]}


def nested(depth: int) -> str:
    """response_format with objects nested `depth` deep, as JSON text (json.dumps recurses)."""
    head = '{"type": "object", "required": ["a"], "properties": {"a": '
    schema = head * depth + '{"type": "string"}' + "}}" * depth
    fields = json.dumps(fmt({"type": "string"}))[1:-1]  # then the schema put in its place
    return fields.replace('{"type": "string"}', schema)


# name -> (request fields, the keyword the 400 names, where its param ends)
HOSTILE: dict[str, tuple[Callable[[], Body | str], str, str]] = {
    "minItems 1e8": (
        lambda: fmt(one({"type": "array", "minItems": 100_000_000, "items": {"type": "string"}})),
        "minItems",
        "schema.properties.a.minItems",
    ),
    "tool minLength 99999999": (
        lambda: tool(one({"type": "string", "minLength": 99_999_999})),
        "minLength",
        "tools[0].function.parameters.properties.a.minLength",
    ),
    "minLength 1e7": (
        lambda: fmt(one({"type": "string", "minLength": 10_000_000})),
        "minLength",
        "schema.properties.a.minLength",
    ),
    "enum of 1e6 values": (
        # small ints: the body's own decoding (1e6 distinct ints take ~40 MB) is not measured
        lambda: fmt({"enum": [0] * 1_000_000}),
        "enum",
        "schema.enum",
    ),
    "objects nested 26 deep": (lambda: nested(26), "properties", ".properties"),
    "anyOf of 10000 branches": (
        lambda: fmt({"anyOf": [{"const": i} for i in range(10_000)]}),
        "anyOf",
        "schema.anyOf",
    ),
    "5000 optional properties": (
        lambda: tool({"type": "object", "properties": {f"p{i}": {} for i in range(5000)}}),
        "properties",
        "tools[0].function.parameters.properties",
    ),
    "pattern repeated 1e9 times": (
        lambda: fmt(one({"type": "string", "pattern": "^a{0,1000000000}$"})),
        "pattern",
        "schema.properties.a.pattern",
    ),
}


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Served]:
    with Served(tmp_path_factory.mktemp("hostile"), model=tiny_gguf) as served:
        yield served


@pytest.fixture(scope="module")
def keys(box: Served) -> tuple[str, str]:
    """Two members; one answer first, so that the server's one-off allocations on its first
    answer (models loaded on first use, buffers) do not count as growth."""
    mallory, ann = box.user("mallory"), box.user("ann")
    assert ask(box, ann, {}).status_code == 200
    return mallory, ann


def ask(box: Served, key: str, extra: Body | str, max_tokens: int = 8) -> httpx.Response:
    """A chat completion with `extra` request fields (a dict, or their JSON text)."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hello there"}]}
    fields = extra if isinstance(extra, str) else json.dumps(extra)[1:-1]
    text = json.dumps({**body, "max_tokens": max_tokens})[:-1] + (
        f", {fields}}}" if fields else "}"
    )
    return httpx.post(
        box.url + "/v1/chat/completions",
        content=text,
        headers={**box.auth(key), "content-type": "application/json"},
        timeout=60,
    )


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_schema_is_refused_naming_its_keyword(
    box: Served, keys: tuple[str, str], case: str
) -> None:
    make, keyword, where = HOSTILE[case]
    reply = ask(box, keys[0], make())
    assert reply.status_code == 400, reply.text[:500]
    error = reply.json()["error"]
    assert keyword in error["message"]
    assert error["param"].endswith(where), error["param"]


def test_a_huge_upper_bound_is_served_without_spelling_it_out(
    box: Served, keys: tuple[str, str]
) -> None:
    before = box.rss_bytes()
    reply = ask(box, keys[0], fmt(one({"type": "string", "maxLength": 1_000_000_000})))
    assert reply.status_code == 200, reply.text[:500]
    assert box.rss_bytes() - before < 100 * 2**20


def test_hostile_schemas_neither_grow_the_server_nor_stop_another_user(
    box: Served, keys: tuple[str, str]
) -> None:
    mallory, ann = keys
    before = box.rss_bytes()
    with ThreadPoolExecutor(max_workers=len(HOSTILE) + 1) as pool:
        hostile = [pool.submit(ask, box, mallory, make()) for make, _, _ in HOSTILE.values()]
        other = pool.submit(ask, box, ann, {})
        statuses = [f.result().status_code for f in hostile]
        answer = other.result()
    assert statuses == [400] * len(HOSTILE)
    assert answer.status_code == 200, answer.text[:500]
    assert answer.json()["choices"][0]["message"]["content"]
    assert box.rss_bytes() - before < 100 * 2**20
