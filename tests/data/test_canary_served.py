"""The zero-data-retention canary, generated from the route table of `chatbox serve`.

Every route that accepts content (each POST, PUT or PATCH with a request body in the served
/schema/openapi.json, and each HTML form route of the app's route table) is sent a secret word
of its own in every free-text field, by a member with zero retention switched on for herself
and the `X-Chatbox-Retention: none` header on the request; every API route again by members
with one kind of zero retention each (the header alone, an API key set to retention none, a
zero-retention tier), and temporary chats through their own routes. The word must be in no
file of the data directory after the request, after a clean stop, and after kill -9 and a
restart; parked KV files are decoded back into text too. A route that refuses under zero
retention (a 4xx) passes as long as nothing is stored.

A content route added to the app without a case here fails the coverage test: each one is
either exercised (SENDERS) or named with a reason it cannot carry content (NO_CONTENT).
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar.routes import HTTPRoute

from chatbox.app import create_app
from tests.conftest import _answers_unchecked, run_sql, test_settings
from tests.data.test_kv_retention_served import Decoder
from tests.served import Served, files_holding

pytestmark = pytest.mark.timeout(300)

NONE = {"X-Chatbox-Retention": "none"}
WRITES = {"POST", "PUT", "PATCH"}
TIMEOUT = 120.0
BRIEF_TIER = """
[tiers.brief]
rpm = 120
tpm = 200000
max_streams = 4
priority = 1
retention_days = 1

[tiers.vault]
rpm = 120
tpm = 200000
max_streams = 4
priority = 1
zero_retention = true
"""


@dataclass
class Canary:
    """The served box, the member (API key and browser session) and her real ids."""

    box: Served
    key: dict[str, str]
    browser: httpx.Client
    csrf: str
    ids: dict[str, str]
    words: dict[str, str] = field(default_factory=dict)  # route -> its secret word
    asks: dict[str, str] = field(default_factory=lambda: dict(NONE))  # the request's headers
    # Members with one kind of zero retention each: "header", "key" and "tier".
    kinds: dict[str, Canary] = field(default_factory=dict)

    def api(self, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = {**self.key, **self.asks, **kw.pop("headers", {})}
        url = self.box.url + path.format(**self.ids)
        return httpx.request(method, url, headers=headers, timeout=TIMEOUT, **kw)

    def form(self, path: str, **kw: Any) -> httpx.Response:
        """A form post as the page's HTMX sends it: the session cookie and the CSRF header."""
        headers = {"x-csrf-token": self.csrf, "HX-Request": "true", **NONE}
        return self.browser.post(path.format(**self.ids), headers=headers, **kw)


def _text(word: str) -> str:
    # Everyday words: input moderation stays on, and "keep the secret word safe" was refused
    # as illicit about once in 300 random words.
    return f"The picnic list for Saturday includes {word} and lemonade."


def _file(word: str) -> dict[str, Any]:
    return {"file": ("notes.txt", (_text(word) + " ") * 20, "text/plain")}


def _chatgpt(word: str) -> dict[str, Any]:
    conv = {
        "id": "c1",
        "title": word,
        "create_time": 1700000000.0,
        "update_time": 1700000000.0,
        "current_node": "n2",
        "mapping": {
            "n1": {"id": "n1", "message": None, "parent": None, "children": ["n2"]},
            "n2": {
                "id": "n2",
                "message": {
                    "id": "n2",
                    "author": {"role": "user"},
                    "content": {"content_type": "text", "parts": [_text(word)]},
                    "create_time": 1700000000.0,
                },
                "parent": "n1",
                "children": [],
            },
        },
    }
    return {"file": ("conversations.json", json.dumps([conv]).encode(), "application/json")}


def _temporary(c: Canary) -> str:
    made = c.api("POST", "/v1/conversations", json={"temporary": True})
    assert made.status_code == 201, made.text
    return str(made.json()["id"])


def _wrong_login(box: Served, password: str) -> httpx.Response:
    with httpx.Client(base_url=box.url, headers=NONE, timeout=TIMEOUT) as browser:
        page = browser.get("/login")
        token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
        assert token, page.text
        form = {"name": "ann", "password": password, "csrf_token": token.group(1), "next": "/"}
        return browser.post("/login", data=form)


Sender = Callable[[Canary, str], httpx.Response]

# Each content route and how a member sends it a word in every free-text field.
SENDERS: dict[str, Sender] = {
    "POST /v1/conversations": lambda c, w: c.api(
        "POST", "/v1/conversations", json={"title": w, "system_prompt": _text(w)}
    ),
    "PATCH /v1/conversations/{conv_id}": lambda c, w: c.api(
        "PATCH", "/v1/conversations/{conv}", json={"title": w}
    ),
    "POST /v1/conversations/{conv_id}/turns": lambda c, w: c.api(
        "POST", "/v1/conversations/{conv}/turns", json={"content": _text(w), "max_tokens": 2}
    ),
    "POST /v1/conversations/{conv_id}/turns/{turn_id}/edit": lambda c, w: c.api(
        "POST",
        "/v1/conversations/{conv}/turns/{turn}/edit",
        json={"content": _text(w), "max_tokens": 2},
    ),
    "POST /v1/conversations/{conv_id}/turns/{turn_id}/feedback": lambda c, w: c.api(
        "POST",
        "/v1/conversations/{conv}/turns/{answer}/feedback",
        json={"rating": "down", "comment": _text(w)},
    ),
    "POST /v1/chat/completions": lambda c, w: c.api(
        "POST",
        "/v1/chat/completions",
        json={
            "model": "tiny",
            "max_tokens": 2,
            "user": w,
            "messages": [
                {"role": "system", "content": _text(w)},
                {"role": "user", "content": _text(w)},
            ],
        },
    ),
    "POST /v1/responses": lambda c, w: c.api(
        "POST",
        "/v1/responses",
        json={
            "model": "tiny",
            "max_output_tokens": 2,
            "user": w,
            "instructions": _text(w),
            "input": [{"role": "user", "content": _text(w)}],
        },
    ),
    "POST /v1/completions": lambda c, w: c.api(
        "POST",
        "/v1/completions",
        json={"model": "tiny", "max_tokens": 2, "user": w, "prompt": [_text(w), _text(w)]},
    ),
    "POST /v1/embeddings": lambda c, w: c.api(
        "POST", "/v1/embeddings", json={"input": [_text(w)], "user": w}
    ),
    "POST /v1/moderations": lambda c, w: c.api("POST", "/v1/moderations", json={"input": _text(w)}),
    "PATCH /v1/users/{user_id}/memory": lambda c, w: c.api(
        "PATCH", "/v1/users/me/memory", json={"add": [_text(w)]}
    ),
    "POST /v1/documents": lambda c, w: c.api("POST", "/v1/documents", files=_file(w)),
    "POST /v1/conversations/{conv_id}/documents": lambda c, w: c.api(
        "POST", "/v1/conversations/{conv}/documents", files=_file(w)
    ),
    "POST /v1/workspaces/{ws_id}/documents": lambda c, w: c.api(
        "POST", "/v1/workspaces/{ws}/documents", files=_file(w)
    ),
    "POST /v1/users/me/import": lambda c, w: c.api(
        "POST", "/v1/users/me/import", files=_chatgpt(w)
    ),
    "POST /ui/new/send": lambda c, w: c.form("/ui/new/send", data={"content": _text(w)}),
    "POST /ui/c/{conv_id}/send": lambda c, w: c.form(
        "/ui/c/{conv}/send", data={"content": _text(w), "system_prompt": _text(w)}
    ),
    "POST /ui/c/{conv_id}/turns/{turn_id}/edit": lambda c, w: c.form(
        "/ui/c/{conv}/turns/{turn}/edit", data={"content": _text(w)}
    ),
    "POST /ui/c/{conv_id}/turns/{turn_id}/feedback": lambda c, w: c.form(
        "/ui/c/{conv}/turns/{answer}/feedback", data={"rating": "up", "comment": _text(w)}
    ),
    "POST /ui/c/{conv_id}/settings": lambda c, w: c.form(
        "/ui/c/{conv}/settings", data={"title": w, "system_prompt": _text(w)}
    ),
    "POST /ui/temporary/send": lambda c, w: c.form(
        "/ui/temporary/send", data={"content": _text(w)}
    ),
    "POST /ui/temporary/{conv_id}/send": lambda c, w: c.form(
        f"/ui/temporary/{_temporary(c)}/send", data={"content": _text(w)}
    ),
    "POST /ui/memory/add": lambda c, w: c.form("/ui/memory/add", data={"text": _text(w)}),
    "POST /ui/memory/{fact_id}/edit": lambda c, w: c.form(
        "/ui/memory/{fact}/edit", data={"text": _text(w)}
    ),
    "POST /ui/library/documents": lambda c, w: c.form("/ui/library/documents", files=_file(w)),
    "POST /ui/new/documents": lambda c, w: c.form("/ui/new/documents", files=_file(w)),
    "POST /ui/c/{conv_id}/documents": lambda c, w: c.form("/ui/c/{conv}/documents", files=_file(w)),
    "POST /ui/w/{ws_id}/documents": lambda c, w: c.form("/ui/w/{ws}/documents", files=_file(w)),
    "POST /ui/settings/import": lambda c, w: c.form("/ui/settings/import", files=_chatgpt(w)),
    # A wrong password is content a client sends: it must never be written down.
    "POST /login": lambda c, w: _wrong_login(c.box, w),
}

# Routes of the table that take a body but no content: why each cannot carry a secret.
IDS_ONLY = "its body holds only ids, switches or enum values the server checks"
NAMES = "admin configuration: the names of users, models and workspaces are kept by design"
NO_CONTENT: dict[str, str] = {
    "POST /v1/conversations/{conv_id}/branch": IDS_ONLY,
    "POST /v1/conversations/{conv_id}/turns/{turn_id}/regenerate": IDS_ONLY,
    "POST /v1/conversations/{conv_id}/shares": IDS_ONLY,
    "POST /v1/conversations/{conv_id}/workspace": IDS_ONLY,
    "PATCH /v1/users/me/retention": IDS_ONLY,
    "POST /v1/users/me/delete": "erases the account (the erasure tests); its body is the name",
    "POST /v1/admin/moderation/{item_id}/resolve": IDS_ONLY,
    "POST /v1/admin/replicas": "admin configuration: a replica's URL is kept by design",
    "POST /v1/admin/replicas/drain": "admin configuration: a replica's URL is kept by design",
    "POST /v1/admin/shadow/start": "admin configuration: a rule (tier, model, percent), no content",
    "POST /v1/admin/shadow/stop": "admin configuration: a rule's removal",
    "POST /v1/admin/evals": "an admin's eval suite and the model's answers to it, kept by design"
    " as `chatbox eval run` keeps them: no person's content",
    "POST /v1/workspaces": NAMES,
    "POST /v1/workspaces/{ws_id}/members": NAMES,
    "POST /logout": "no body but the CSRF token",
    "POST /ui/settings/delete": "erases the account (the erasure tests); its body is the name",
    "POST /ui/settings/retention": IDS_ONLY,
    "POST /ui/temporary/{conv_id}/stop": "no body: stops a generation",
    "POST /ui/c/{conv_id}/stop": "no body: stops a generation",
    "POST /ui/memory/{fact_id}/delete": "no body: an erasure",
    "POST /ui/memory/enabled": IDS_ONLY,
    "POST /ui/library/documents/{doc_id}/delete": "no body: an erasure",
    "POST /ui/c/{conv_id}/documents/{doc_id}/delete": "no body: an erasure",
    "POST /ui/c/{conv_id}/branch": IDS_ONLY,
    "POST /ui/c/{conv_id}/turns/{turn_id}/regenerate": IDS_ONLY,
    "POST /ui/c/{conv_id}/delete": IDS_ONLY,
    "POST /ui/c/{conv_id}/workspace": IDS_ONLY,
    "POST /ui/c/{conv_id}/shares": IDS_ONLY,
    "POST /ui/c/{conv_id}/shares/{share_id}/revoke": "no body: an erasure",
    "POST /ui/w/{ws_id}/members": NAMES,
    "POST /ui/w/{ws_id}/members/{user_id}/delete": "no body: a removal",
    "POST /ui/w/{ws_id}/documents/{doc_id}/delete": "no body: an erasure",
    "POST /s/{token}/continue": "no body: copies a share the owner already stored",
    "POST /console/models": NAMES,
    "POST /console/people": NAMES,
    "POST /console/models/{model}/{action}": NAMES,
    "POST /console/canaries/{arm}/{action}": NAMES,
    "POST /console/people/{user_id}/{action}": NAMES,
    "POST /console/people/{user_id}/revoke-key/{key_id}": "no body: a revocation",
    "POST /console/workspaces": NAMES,
    "POST /console/workspaces/{ws_id}/owners": NAMES,
    "POST /console/workspaces/{ws_id}/delete": "no body: an erasure",
    "POST /console/tools": "admin configuration: an MCP server's URL and headers, by design",
    "POST /console/tools/{server}/check": "no body: starts a server and lists its tools",
    "POST /console/tools/{server}/remove": "no body: a removal",
    "POST /console/tools/{server}/mark": "admin configuration: which tools are read-only",
    "POST /console/alerts/silence": "admin configuration: an alert's name and a period",
    "POST /console/alerts/unsilence": "admin configuration: an alert's name",
    "POST /console/replicas/drain": "admin configuration: a replica's URL is kept by design",
    "POST /console/replicas/undrain": "admin configuration: a replica's URL is kept by design",
    "POST /ui/c/{conv_id}/tool-calls/{call_id}": "a decision on a tool call: allow or deny",
    "POST /v1/conversations/{conv_id}/tool-calls/{call_id}/approval": IDS_ONLY,
    "POST /admin/moderation/{item_id}/resolve": IDS_ONLY,
}


def _route_key(method: str, path: str) -> str:
    return f"{method} {re.sub(r':[a-z]+}', '}', path)}"


def content_routes(schema: dict[str, Any], tmp: Path) -> set[str]:
    """The served schema's writes with a request body, plus every form route of the app's
    route table that the schema does not list (the HTML pages' posts)."""
    found = {
        _route_key(method.upper(), path)
        for path, item in schema["paths"].items()
        for method, op in item.items()
        if method.upper() in WRITES and "requestBody" in op
    }
    documented = {_route_key(m.upper(), p) for p, item in schema["paths"].items() for m in item}
    app = create_app(test_settings(tmp / "data"))
    for route in app.routes:
        if isinstance(route, HTTPRoute):
            for method in route.methods & WRITES:
                key = _route_key(method, route.path)
                if key not in documented:
                    found.add(key)
    return found


def _login(box: Served, name: str) -> tuple[httpx.Client, str]:
    browser = httpx.Client(base_url=box.url, timeout=TIMEOUT)
    page = browser.get("/login")
    token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert token, page.text
    r = browser.post(
        "/login",
        data={"name": name, "password": name * 2, "csrf_token": token.group(1), "next": "/"},
    )
    assert r.status_code == 303, r.text
    csrf = re.search(r'"x-csrf-token": "([^"]+)"', browser.get("/").text)
    assert csrf
    return browser, csrf.group(1)


def _real_ids(box: Served, name: str, key: dict[str, str], stored: bool = True) -> dict[str, str]:
    """Ids the member owns, made before she switches zero retention on (a member of a
    zero-retention tier owns none: hers are ids she cannot see)."""
    ids = {"conv": "c_missing", "turn": "t_missing", "answer": "t_missing", "fact": "m_missing"}
    if stored:
        with httpx.Client(base_url=box.url, headers=key, timeout=TIMEOUT) as c:
            conv = c.post("/v1/conversations", json={"title": "kept"}).json()["id"]
            said = c.post(
                f"/v1/conversations/{conv}/turns", json={"content": "Hi", "max_tokens": 2}
            )
            assert said.status_code == 200, said.text
            turns = c.get(f"/v1/conversations/{conv}").json()["turns"]
            assert [t["role"] for t in turns] == ["user", "assistant"], turns
            fact = c.patch("/v1/users/me/memory", json={"add": ["Likes pumps"]}).json()
        ids = {
            "conv": conv,
            "turn": turns[0]["id"],
            "answer": turns[1]["id"],
            "fact": fact["added"][0]["id"],
        }
    with httpx.Client(base_url=box.url, headers=box.admin, timeout=TIMEOUT) as admin:
        ws = admin.post("/v1/workspaces", json={"name": f"team {name}"}).json()["id"]
        added = admin.post(f"/v1/workspaces/{ws}/members", json={"name": name})
        assert added.status_code in (200, 201), added.text
    return {**ids, "ws": ws}


@pytest.fixture(scope="module")
def canary(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Canary]:
    where = tmp_path_factory.mktemp("canary")
    policy = _answers_unchecked(None, where)
    policy.write_text(policy.read_text() + BRIEF_TIER)
    box = Served(where, model=tiny_gguf, policy=policy)
    key = box.auth(box.user("ann", tier="paid"))
    hal = box.auth(box.user("hal", tier="paid"))
    with box:
        ids = _real_ids(box, "ann", key)
        hals = _real_ids(box, "hal", hal)
        r = httpx.patch(
            box.url + "/v1/users/me/retention", json={"zero_retention": True}, headers=key
        )
        assert r.status_code == 200 and r.json()["zero_retention"] is True, r.text
        kim = box.auth(kim_key := box.user("kim", tier="paid"))
        kims = _real_ids(box, "kim", kim)
        box.cli("keys", "set-retention", kim_key[:10], "none")
        tia = box.auth(box.user("tia", tier="vault"))
        tias = _real_ids(box, "tia", tia, stored=False)
        browser, csrf = _login(box, "ann")
        try:
            canary = Canary(box, key, browser, csrf, ids)
            canary.kinds = {
                "header": Canary(box, hal, browser, "", hals, canary.words),
                "key": Canary(box, kim, browser, "", kims, canary.words, asks={}),
                "tier": Canary(box, tia, browser, "", tias, canary.words, asks={}),
            }
            yield canary
        finally:
            browser.close()


def test_every_content_route_is_exercised_or_named(canary: Canary, tmp_path: Path) -> None:
    schema = httpx.get(canary.box.url + "/schema/openapi.json", timeout=TIMEOUT).json()
    found = content_routes(schema, tmp_path)
    assert set(SENDERS).isdisjoint(NO_CONTENT)
    assert sorted(found - set(SENDERS) - set(NO_CONTENT)) == [], "content routes with no canary"
    assert sorted((set(SENDERS) | set(NO_CONTENT)) - found) == [], "cases for no route"


# Routes whose canary is stored today (strict: they fail once the leak is fixed).
LEAKS: dict[str, str] = {}


def _cases() -> list[Any]:
    return [
        pytest.param(k, marks=pytest.mark.xfail(strict=True, reason=LEAKS[k])) if k in LEAKS else k
        for k in SENDERS
    ]


@pytest.mark.parametrize("route", _cases())
def test_a_routes_secret_is_stored_nowhere(canary: Canary, route: str) -> None:
    word = f"canary{secrets.token_hex(6)}"
    canary.words[route] = word
    r = SENDERS[route](canary, word)
    assert r.status_code < 500, (route, r.status_code, r.text[:500])
    assert files_holding(canary.box.data_dir, word) == [], (route, r.status_code)


# One kind of zero retention at a time, from members who keep content otherwise: the
# X-Chatbox-Retention header alone, an API key set to retention none, a zero-retention tier
# (API routes: pages send no header and a browser session has no key).
KINDS = ("header", "key", "tier")
API = [k for k in SENDERS if k.split()[1].startswith("/v1/")]


@pytest.mark.parametrize("route", API)
@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_of_zero_retention_keeps_a_routes_secret_nowhere(
    canary: Canary, kind: str, route: str
) -> None:
    word = f"canary{secrets.token_hex(6)}"
    canary.words[f"{kind} {route}"] = word
    r = SENDERS[route](canary.kinds[kind], word)
    assert r.status_code < 500, (route, r.status_code, r.text[:500])
    assert files_holding(canary.box.data_dir, word) == [], (route, r.status_code)


def test_no_secret_survives_a_stop_or_a_crash(canary: Canary, tiny_gguf: Path) -> None:
    box, decoder = canary.box, Decoder(tiny_gguf)
    words = {r: w for r, w in canary.words.items() if r not in LEAKS}
    ran = {*SENDERS, *(f"{kind} {k}" for kind in KINDS for k in API)} - set(LEAKS)
    assert set(words) == ran, "run with the route cases"

    def stored() -> list[str]:
        kv = set(decoder.holding(box.data_dir, *words.values()))
        return [r for r, w in words.items() if w in kv or files_holding(box.data_dir, w)]

    box.stop()  # a clean stop parks every idle conversation the server still holds
    assert stored() == []
    box.start()
    canary.api("POST", "/v1/conversations/{conv}/turns", json={"content": "Hi", "max_tokens": 2})
    box.kill()
    assert stored() == []
    box.start()
    assert stored() == []


def _anywhere(box: Served, word: str) -> list[str]:
    """Files holding the word or a part of it (FTS keeps terms prefix-compressed), and on
    PostgreSQL the tables with a live row holding it."""
    parts = (word, word[:9], word[-9:])
    return sorted({f for part in parts for f in box.holding(part)})


def test_erased_content_leaves_no_secret_after_a_crash(canary: Canary) -> None:
    box = canary.box
    words = {k: f"gone{secrets.token_hex(6)}" for k in ("conv", "doc", "fact", "share", "account")}
    bea = httpx.Client(base_url=box.url, headers=box.auth(box.user("bea")), timeout=TIMEOUT)
    cy = httpx.Client(base_url=box.url, headers=box.auth(box.user("cy")), timeout=TIMEOUT)

    def converse(http: httpx.Client, word: str) -> str:
        conv = http.post("/v1/conversations", json={"title": word}).json()["id"]
        said = http.post(f"/v1/conversations/{conv}/turns", json={"content": _text(word)})
        assert said.status_code == 200, said.text
        return str(conv)

    def document(http: httpx.Client, word: str) -> str:
        doc = http.post("/v1/documents", files=_file(word))
        assert doc.status_code == 201, doc.text
        return str(doc.json()["id"])

    def remember(http: httpx.Client, word: str) -> str:
        fact = http.patch("/v1/users/me/memory", json={"add": [_text(word)]})
        assert fact.status_code == 200, fact.text
        return str(fact.json()["added"][0]["id"])

    conv, shared = converse(bea, words["conv"]), converse(bea, words["share"])
    share = bea.post(f"/v1/conversations/{shared}/shares", json={})
    assert share.status_code == 201, share.text
    doc, fact = document(bea, words["doc"]), remember(bea, words["fact"])
    converse(cy, words["account"])
    document(cy, words["account"])
    remember(cy, words["account"])
    for word in words.values():
        assert _anywhere(box, word), f"the test needs {word} on disk first"

    assert bea.delete(f"/v1/conversations/{conv}").status_code == 204
    assert bea.delete(f"/v1/conversations/{shared}").status_code == 204
    assert bea.delete(f"/v1/shares/{share.json()['id']}").status_code == 204
    assert bea.delete(f"/v1/documents/{doc}").status_code == 204
    assert bea.delete(f"/v1/users/me/memory/{fact}").status_code == 204
    gone = cy.post("/v1/users/me/delete", json={"confirm": "cy"})
    assert gone.status_code == 204, gone.text
    bea.close()
    cy.close()
    box.kill()
    assert {k: _anywhere(box, w) for k, w in words.items() if _anywhere(box, w)} == {}
    box.start()
    assert {k: _anywhere(box, w) for k, w in words.items() if _anywhere(box, w)} == {}


def test_a_retention_run_leaves_no_secret_after_a_crash(canary: Canary, tiny_gguf: Path) -> None:
    box, decoder = canary.box, Decoder(tiny_gguf)
    word = f"aged{secrets.token_hex(6)}"
    dee = box.auth(box.user("dee", tier="brief"))
    conv = httpx.post(box.url + "/v1/conversations", json={"title": word}, headers=dee).json()
    said = httpx.post(
        f"{box.url}/v1/conversations/{conv['id']}/turns",
        json={"content": _text(word)},
        headers=dee,
        timeout=TIMEOUT,
    )
    assert said.status_code == 200, said.text
    box.stop()  # parks the conversation's KV; then it is made two days idle
    run_sql(
        box.database,
        "UPDATE conversations SET updated_at = ? WHERE id = ?",
        (time.time() - 2 * 86400, conv["id"]),
    )
    assert _anywhere(box, word), "the test needs the word on disk first"
    box.start()
    run = httpx.post(box.url + "/v1/admin/retention/run", headers=box.admin, timeout=TIMEOUT)
    assert run.status_code == 200, run.text
    # Expired by this run, or by the sweep every start runs 5 s in (first on a loaded machine).
    gone = httpx.get(f"{box.url}/v1/conversations/{conv['id']}", headers=dee, timeout=TIMEOUT)
    assert gone.status_code == 404, gone.text
    box.kill()
    assert _anywhere(box, word) == [] and decoder.holding(box.data_dir, word) == []
    box.start()
    assert _anywhere(box, word) == [] and decoder.holding(box.data_dir, word) == []
