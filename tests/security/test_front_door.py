"""The front door of `chatbox serve`: malformed requests get a 4xx naming the problem, never a
500; credentials are checked before anything else; the schema says what the server does.

CORPUS holds every input that once made the served app fail (a 500, or an answer the schema
did not document), each with the answer it must get now; add to it whatever a fuzzer finds.
One served process (tiny model) answers the whole module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.served import Served

pytestmark = pytest.mark.timeout(300)

DEEP = "[" * 1000 + "]" * 1000  # nested a thousand levels: a RecursionError once
HI = [{"role": "user", "content": "hi"}]


@dataclass
class Door:
    box: Served
    member: dict[str, str]
    ids: dict[str, str]

    def call(
        self,
        method: str,
        path: str,
        *,
        anonymous: bool = False,
        headers: dict[str, str] | None = None,
        **kw: Any,
    ) -> httpx.Response:
        sent = {**({} if anonymous else self.member), **(headers or {})}
        url = self.box.url + path.format(**self.ids)
        return httpx.request(method, url, headers=sent, timeout=120, **kw)


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Door]:
    with Served(tmp_path_factory.mktemp("door"), model=tiny_gguf) as box:
        member = box.auth(box.user("mallory", tier="paid"))
        conv = httpx.post(box.url + "/v1/conversations", headers=member, json={}).json()["id"]
        yield Door(box, member, {"conv": conv})


@dataclass(frozen=True)
class Case:
    """One request that once failed, and the status (and words) it must get now."""

    name: str
    method: str
    path: str
    status: int
    says: str = ""
    json: Any = None
    content: str | None = None
    anonymous: bool = False
    params: dict[str, str] = field(default_factory=dict)


def _deep(body: str) -> str:
    return body.replace("DEEP", DEEP)


CORPUS = [
    *(
        Case(f"user={raw} on {path}", "POST", path, 400, "user", json={**body, "user": value})
        for raw, value in (("5", 5), ("{}", {}), ("[1]", [1]), ("true", True))
        for path, body in (
            ("/v1/chat/completions", {"messages": HI, "max_tokens": 2}),
            ("/v1/embeddings", {"input": "hi"}),
        )
    ),
    Case("passage id past 64 bits", "GET", "/v1/passages/9223372036854775808", 400, "chunk_id"),
    Case("passage id past 2^53", "GET", "/v1/passages/9223372036854775999", 400, "chunk_id"),
    Case(
        "before past 64 bits",
        "GET",
        "/v1/conversations/{conv}",
        400,
        "before",
        params={"before": "9223372036854775808"},
    ),
    Case(
        "nested conversation",
        "POST",
        "/v1/conversations",
        400,
        "64",
        content=_deep('{"title": DEEP}'),
    ),
    Case(
        "nested turn",
        "POST",
        "/v1/conversations/{conv}/turns",
        400,
        "64",
        content=_deep('{"content": "hi", "stop": DEEP}'),
    ),
    Case(
        "nested completion",
        "POST",
        "/v1/chat/completions",
        400,
        "64",
        content=_deep('{"messages": [{"role": "user", "content": DEEP}]}'),
    ),
    Case(
        "nested tool parameters",
        "POST",
        "/v1/chat/completions",
        400,
        "64",
        content=_deep(
            '{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": '
            '"function", "function": {"name": "f", "parameters": {"a": DEEP}}}]}'
        ),
    ),
    Case("anonymous replicas without url", "DELETE", "/v1/admin/replicas", 401, anonymous=True),
    Case("member replicas without url", "DELETE", "/v1/admin/replicas", 403, "admin"),
    Case("member admin usage", "GET", "/v1/admin/usage", 403, "admin"),
    Case(
        "anonymous turn with a bad body",
        "POST",
        "/v1/conversations/{conv}/turns",
        401,
        json={"content": 5},
        anonymous=True,
    ),
    Case(
        "0 as a boolean in a body",
        "POST",
        "/v1/conversations",
        400,
        "temporary",
        json={"temporary": 0},
    ),
    Case(
        "0 as a boolean in a query",
        "DELETE",
        "/v1/conversations/{conv}",
        400,
        "revoke_links",
        params={"revoke_links": "0"},
    ),
    Case("no messages", "POST", "/v1/chat/completions", 400, "messages", json={"messages": []}),
    Case("no moderation input", "POST", "/v1/moderations", 400, "input", json={"input": []}),
    Case("empty confirmation", "POST", "/v1/users/me/delete", 400, "confirm", json={"confirm": ""}),
    Case("bodiless delete-me", "POST", "/v1/users/me/delete", 400),
    Case(
        "300,000 characters",
        "POST",
        "/v1/conversations/{conv}/turns",
        413,
        "300,000 characters",
        json={"content": "x" * 300_000},
    ),
]


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.name)
def test_corpus_answers_as_it_must(door: Door, case: Case) -> None:
    kw: dict[str, Any] = {"params": case.params, "anonymous": case.anonymous}
    if case.json is not None:
        kw["json"] = case.json
    if case.content is not None:
        kw["content"] = case.content
        kw["headers"] = {"content-type": "application/json"}
    response = door.call(case.method, case.path, **kw)
    assert response.status_code == case.status, response.text[:500]
    body = response.json()
    assert case.says in body["error"]["message"] or case.says == body["error"].get("param")
    if case.status == 413:
        assert "tokens" not in body["error"]["message"]


def test_login_with_a_non_ascii_csrf_token_is_refused(door: Door) -> None:
    with httpx.Client(base_url=door.box.url) as browser:
        browser.get("/login")  # sets the login CSRF cookie
        response = browser.post(
            "/login", data={"name": "mallory", "password": "x", "csrf_token": "é" * 32}
        )
    assert response.status_code == 403 and "form expired" in response.text


def test_options_names_every_method(door: Door) -> None:
    response = door.call("OPTIONS", "/v1/conversations/{conv}")
    assert response.status_code == 204
    assert set(response.headers["allow"].split(", ")) == {"DELETE", "GET", "OPTIONS", "PATCH"}


def test_schema_says_what_the_server_sends(door: Door) -> None:
    schema = httpx.get(door.box.url + "/schema/openapi.json").json()
    paths = schema["paths"]
    export = door.call("GET", "/v1/users/me/export")
    documented = paths["/v1/users/me/export"]["get"]["responses"]["200"]["content"]
    assert export.headers["content-type"] in documented
    for path in ("/v1/documents", "/v1/conversations/{conv_id}/documents", "/v1/users/me/import"):
        body = paths[path]["post"]["requestBody"]
        assert (
            body["required"]
            and "file" in body["content"]["multipart/form-data"]["schema"]["properties"]
        ), path
        assert {"413", "415", "422"} <= set(paths[path]["post"]["responses"]), path
    assert "403" in paths["/v1/admin/replicas"]["delete"]["responses"]
    assert paths["/v1/conversations"]["post"]["requestBody"]["required"] is False
    examples = [
        media.get("example")
        for item in paths.values()
        for op in item.values()
        for media in op.get("requestBody", {}).get("content", {}).values()
        if "application/json" in op.get("requestBody", {}).get("content", {})
    ]
    assert examples and all(e is not None for e in examples)
    assert json.dumps(examples)  # plain JSON
