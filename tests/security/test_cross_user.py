"""The cross-user matrix: every route that takes an id, called with another user's ids.

Bob (a member) owns a conversation with turns, a document attached to it, a library
document, a cited passage, a memory fact and an API key. Mallory (a member) and the admin
then call every route of the app's route table that takes such an id — the API, the UI
partials under /ui and the pages (/c, /memory, /library), which the OpenAPI schema leaves
out — with bob's ids, and with bob's ids mixed into their own (their conversation, bob's
turn). Each call must answer 404: not 403 (that says the id exists), not 200, not 500; and
none may show bob's content or change bob's data. A route whose path takes an id this
matrix does not know fails the test, so a new route cannot slip past it.

The admin is no exception: chatbox's promise is "usage, not content", so bob's memory is
as closed to the admin as his conversations.

The removed-member column: a member who leaves a workspace (here one who started a
conversation there) gets the same 404 on every route of the table with its ids, and no route
without an id (search, export, lists, pages: every GET of the table) shows any of it, a
teammate's turn written after the removal included.
"""

from __future__ import annotations

import io
import itertools
import re
import zipfile
from dataclasses import dataclass, field
from typing import Any

import pytest
from litestar.testing import TestClient

from tests.conftest import bearer, seed_user
from tests.security.conftest import MANUAL, QUESTION, Cast, send_turn

pytestmark = pytest.mark.timeout(300)

# Path segments that never carry a user's ids.
# Erasing another account is an admin's audited power, not a leak (tests/data covers who may).
# The console (/console/, admins only: members get its guard's 403) acts on accounts as an
# admin's audited power too (usage, keys), never showing content; tests/web/test_console.py.
# So is the moderation review queue (admins only; tests/moderation covers who may). A model
# (/v1/models/{id}) belongs to the box, not to a user: every user may read what it serves.
NOT_OWNED = (
    "/v1/models/",
    "/static/",
    "/schema",
    "/v1/admin/users/",
    "/console/",
    "/admin/moderation/",
    "/v1/admin/moderation/",
)
SECRET = re.compile(r"bobsecret|zephyr", re.IGNORECASE)
SEARCH = "descale pump citric acid"  # finds bob's turns without naming a secret word
# The streaming bubble's SSE answers an unknown or foreign answer with a 200 and its final
# "no longer available" frame, so that the SSE client stops instead of retrying
# (chatbox.web.ui.helpers.ui_stream); it must still show nothing of bob's.
SSE_FINAL_FRAME = ("GET /ui/c/{conv_id:str}/turns/{turn_id:str}/stream",)
# Managing a workspace that one is not a member of (its members, deleting it) is an admin's
# audited power, not a leak; reading anything in it is not (tests/web/test_workspaces.py).
ADMIN_POWERS = (
    "DELETE /v1/workspaces/{ws_id:str}",
    "POST /v1/workspaces/{ws_id:str}/members",
    "DELETE /v1/workspaces/{ws_id:str}/members/{user_id:str}",
    "POST /ui/w/{ws_id:str}/members",
    "POST /ui/w/{ws_id:str}/members/{user_id:str}/delete",
)


@dataclass
class World:
    """One user's ids: what the matrix substitutes for each path parameter."""

    headers: dict[str, str]
    user_id: str = ""
    conv_id: str = ""
    user_turn: str = ""
    answer: str = ""
    conv_doc: str = ""
    library_doc: str = ""
    chunk_id: int | None = None
    fact_id: str = ""
    key_id: str = ""
    share_id: str = ""
    ws_id: str = ""
    response_id: str = ""  # a kept /v1/responses answer
    call_id: str = ""  # a tool call's id (asked of the victim's conversation)
    # Tokens of links that no longer show anything (one revoked, one never issued): a valid
    # token is public by design (`/s/{token}`), so only dead ones belong in the matrix.
    dead_tokens: list[str] = field(default_factory=list)

    def ids(self, param: str, *, victim: bool) -> list[Any]:
        """The values of one path parameter: all of a victim's, or one's own."""
        values: dict[str, list[Any]] = {
            "conv_id": [self.conv_id],
            "turn_id": [self.user_turn, self.answer] if victim else [self.answer],
            "doc_id": [self.conv_doc, self.library_doc] if victim else [self.conv_doc],
            "chunk_id": [self.chunk_id] if self.chunk_id is not None else [],
            "fact_id": [self.fact_id],
            "user_id": [self.user_id] if victim else ["me"],
            "key_id": [self.key_id],
            "share_id": [self.share_id],
            "ws_id": [self.ws_id],
            "response_id": [self.response_id],
            "call_id": [self.call_id],
            "token": self.dead_tokens if victim else [],
        }
        if param not in values:
            raise KeyError(param)
        return [v for v in values[param] if v not in (None, "")]


def _key_id(client: TestClient, user_id: str) -> str:
    store = client.app.state.services.store

    async def newest() -> str:
        keys = await store.keys.list(user_id)
        return str(keys[-1].id)

    return str(client.blocking_portal.call(newest))


def build_world(client: TestClient, headers: dict[str, str], tag: str, *, cited: bool) -> World:
    """A conversation with a turn, an attached and a library document, a fact, a key id."""
    w = World(headers)
    r = client.post("/v1/conversations", headers=headers, json={"title": f"{tag} title"})
    assert r.status_code == 201, r.text
    w.conv_id = r.json()["id"]
    body = MANUAL if cited else f"{tag} notes.\n\n" + "Plain filler words here. " * 40
    r = client.post(
        f"/v1/conversations/{w.conv_id}/documents",
        headers=headers,
        files={"file": (f"{tag}-manual.txt", body.encode(), "text/plain")},
    )
    assert r.status_code == 201, r.text
    w.conv_doc = r.json()["id"]
    question = QUESTION if cited else f"What do my {tag} notes say?"
    w.user_turn, w.answer, got = send_turn(client, headers, w.conv_id, question)
    if cited:
        cites = [e.json() for e in got if e.event == "citations"]
        assert cites, "bob's answer cited no passage: the matrix needs a passage id"
        w.chunk_id = int(cites[0]["citations"][0]["chunk_id"])
    r = client.post(
        "/v1/documents",
        headers=headers,
        files={"file": (f"{tag}-library.txt", f"{tag} library text. ".encode() * 40, "text/plain")},
    )
    assert r.status_code == 201, r.text
    w.library_doc = r.json()["id"]
    r = client.patch(
        "/v1/users/me/memory", headers=headers, json={"add": [f"The user's codename is {tag}"]}
    )
    assert r.status_code == 200, r.text
    w.fact_id = r.json()["added"][0]["id"]
    w.user_id = r.json()["user_id"]
    w.key_id = _key_id(client, w.user_id)
    r = client.post(f"/v1/conversations/{w.conv_id}/shares", headers=headers, json={})
    assert r.status_code == 201, r.text
    w.share_id = r.json()["id"]
    r = client.post(f"/v1/conversations/{w.conv_id}/shares", headers=headers, json={})
    assert r.status_code == 201, r.text
    assert client.delete(f"/v1/shares/{r.json()['id']}", headers=headers).status_code == 204
    w.dead_tokens = [r.json()["token"], "x" + r.json()["token"][1:]]
    r = client.post(
        "/v1/responses",
        headers=headers,
        json={"model": "tiny", "input": f"{tag} asks", "max_output_tokens": 2},
    )
    assert r.status_code == 200, r.text
    w.response_id = r.json()["id"]
    w.call_id = f"call_{tag}0123456789"  # waits in no answer: its conversation decides
    return w


def add_workspace(
    client: TestClient, admin: dict[str, str], w: World, owner: str, *names: str
) -> None:
    """A workspace (made by the admin) owned by w's user (named `owner`), with these members."""
    r = client.post("/v1/workspaces", headers=admin, json={"name": f"team of {owner}"})
    assert r.status_code == 201, r.text
    w.ws_id = r.json()["id"]
    for name, role in [(owner, "owner"), *((n, "member") for n in names)]:
        r = client.post(
            f"/v1/workspaces/{w.ws_id}/members", headers=admin, json={"name": name, "role": role}
        )
        assert r.status_code == 201, r.text


def fingerprint(client: TestClient, bob: World) -> dict[str, Any]:
    """What bob can see of his own data (to tell whether a foreign call changed it)."""
    h = bob.headers
    conv = client.get(f"/v1/conversations/{bob.conv_id}", headers=h)
    memory = client.get("/v1/users/me/memory", headers=h).json()
    cites = client.get(f"/v1/conversations/{bob.conv_id}/turns/{bob.answer}/citations", headers=h)
    return {
        "conversations": [
            c["id"] for c in client.get("/v1/conversations", headers=h).json()["data"]
        ],
        "conversation": conv.status_code == 200
        and {k: conv.json()[k] for k in ("title", "system_prompt", "model")},
        "turns": conv.status_code == 200
        and [(t["id"], t["content"]) for t in conv.json()["turns"]],
        "documents": sorted(d["id"] for d in client.get("/v1/documents", headers=h).json()["data"]),
        "memory": (memory["enabled"], sorted((f["id"], f["text"]) for f in memory["data"])),
        "citations": cites.status_code == 200 and len(cites.json()["data"]),
        "shares": sorted(s["id"] for s in client.get("/v1/shares", headers=h).json()["data"]),
        "workspace": bob.ws_id
        and client.get(f"/v1/workspaces/{bob.ws_id}/documents", headers=h).json(),
    }


@dataclass
class Call:
    method: str
    url: str
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    data: dict[str, str] | None = None
    files: dict[str, Any] | None = None
    route: str = ""
    ok_statuses: tuple[int, ...] = (404,)
    ok_empty_list: bool = False  # a list filtered by a foreign id may answer 200 and nothing

    def describe(self) -> str:
        query = "&".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.method} {self.url}{'?' + query if query else ''}"


def _upload() -> dict[str, Any]:
    return {"file": ("pwned.txt", b"mallory was here " * 30, "text/plain")}


def body_for(method: str, path: str, victim: World) -> dict[str, Any]:
    """A plausible body for the route, so that a refusal is about the id, not the body."""
    if method not in ("POST", "PATCH", "PUT"):
        return {}
    ui = not path.startswith("/v1/")
    if path.endswith("/documents"):
        return {"files": _upload()}
    if path.endswith("/turns") or path.endswith("/send"):
        return (
            {"data": {"content": "pwned"}}
            if ui
            else {"json": {"content": "pwned", "max_tokens": 2}}
        )
    if path.endswith("/edit"):
        if "/memory/" in path:
            return {"data": {"text": "pwned"}}
        return (
            {"data": {"content": "pwned"}}
            if ui
            else {"json": {"content": "pwned", "max_tokens": 2}}
        )
    if path.endswith("/regenerate"):
        return {} if ui else {"json": {"max_tokens": 2}}
    if path.endswith("/feedback"):
        return {"data": {"rating": "down"}} if ui else {"json": {"rating": "down"}}
    if "/tool-calls/" in path:  # a decision on a call waiting in the victim's answer
        return {"data": {"allow": "true"}} if ui else {"json": {"allow": True}}
    if path.endswith("/branch"):
        return {"data": {"turn_id": victim.answer}} if ui else {"json": {"turn_id": victim.answer}}
    if path.endswith("/settings"):
        return {"data": {"title": "pwned"}}
    if path.endswith("/members"):
        return {"data": {"name": "mallory"}} if ui else {"json": {"name": "mallory"}}
    if path.endswith("/workspace"):
        return {"json": {"workspace_id": None}}
    if path.endswith("/memory") and method == "PATCH":
        return {"json": {"add": ["pwned"]}}
    if method == "PATCH":
        return {"json": {"title": "pwned", "system_prompt": "pwned"}}
    return {}


def route_table(client: TestClient) -> list[tuple[str, str, list[str]]]:
    """(method, path template, path parameter names) of every handler of the app."""
    out = []
    for route in client.app.routes:
        params = list(getattr(route, "path_parameters", None) or ())
        for handler in route.route_handlers:
            for method in sorted(getattr(handler, "http_methods", ())):
                if method in ("OPTIONS", "HEAD"):
                    continue
                out.append((method, route.path, params))
    return out


def fill(path: str, values: dict[str, Any]) -> str:
    return re.sub(r"\{(\w+)(?::\w+)?\}", lambda m: str(values[m.group(1)]), path)


def matrix(
    client: TestClient, victim: World, actor: World, *, admin: bool = False
) -> tuple[list[Call], list[str]]:
    """Every call of the matrix for one actor, and the routes it does not know how to fill."""
    calls: list[Call] = []
    unknown: list[str] = []
    for method, path, params in route_table(client):
        if not params or path.startswith(NOT_OWNED):
            continue
        if admin and f"{method} {path}" in ADMIN_POWERS:
            continue
        try:
            choices = [
                [(v, True) for v in victim.ids(p, victim=True)]
                + [(v, False) for v in actor.ids(p, victim=False)]
                for p in params
            ]
        except KeyError as exc:
            unknown.append(f"{method} {path} (takes {exc.args[0]})")
            continue
        for combo in itertools.product(*choices):
            if not any(is_victim for _, is_victim in combo):
                continue
            values = {p: v for p, (v, _) in zip(params, combo, strict=True)}
            route = f"{method} {path}"
            ok = (200, 404) if route in SSE_FINAL_FRAME else (404,)
            calls.append(
                Call(
                    method,
                    fill(path, values),
                    route=route,
                    ok_statuses=ok,
                    **body_for(method, path, victim),
                )
            )
    # Ids carried outside the path.
    v, a = victim, actor
    calls += [
        Call(
            "GET",
            "/v1/documents",
            params={"conversation_id": v.conv_id},
            route="GET /v1/documents?conversation_id",
            ok_empty_list=True,
        ),
        Call(
            "POST",
            "/v1/documents",
            params={"conversation_id": v.conv_id},
            files=_upload(),
            route="POST /v1/documents?conversation_id",
        ),
        Call(
            "POST",
            "/v1/documents",
            data={"conversation_id": v.conv_id},
            files=_upload(),
            route="POST /v1/documents (form conversation_id)",
        ),
        Call(
            "POST",
            f"/v1/conversations/{a.conv_id}/branch",
            json={"turn_id": v.answer},
            route="POST /v1/conversations/{own}/branch {turn_id: foreign}",
        ),
        Call(
            "POST",
            f"/v1/conversations/{a.conv_id}/branch",
            json={"turn_id": v.user_turn},
            route="POST /v1/conversations/{own}/branch {turn_id: foreign}",
        ),
        Call(
            "POST",
            f"/ui/c/{a.conv_id}/branch",
            data={"turn_id": v.answer},
            route="POST /ui/c/{own}/branch turn_id=foreign",
        ),
        Call(
            "PATCH",
            "/v1/users/me/memory",
            json={"remove": [v.fact_id]},
            route="PATCH /v1/users/me/memory {remove: [foreign]}",
        ),
        Call(
            "GET",
            f"/c/{a.conv_id}",
            params={"turn": v.answer},
            route="GET /c/{own}?turn=foreign",
            ok_statuses=(200, 404),
        ),
    ]
    return calls, unknown


def readable(response: Any) -> str:
    """A response's text; a zip's (an export) is the text of every file in it."""
    if not response.content.startswith(b"PK\x03\x04"):
        return str(response.text)
    with zipfile.ZipFile(io.BytesIO(response.content)) as zf:
        return "\n".join(zf.read(n).decode(errors="replace") for n in zf.namelist())


def attempt(
    client: TestClient,
    call: Call,
    headers: dict[str, str],
    bob: World,
    before: dict[str, Any],
    secret: re.Pattern[str] = SECRET,
) -> tuple[str | None, dict[str, Any]]:
    """Make one call; a reason it offends (or None), and bob's data after it."""
    kwargs: dict[str, Any] = {"headers": headers, "params": call.params}
    for name in ("json", "data", "files"):
        if getattr(call, name) is not None:
            kwargs[name] = getattr(call, name)
    response = client.request(call.method, call.url, **kwargs)
    after = fingerprint(client, bob)
    problems = []
    status = response.status_code
    if status not in call.ok_statuses:
        empty = (
            call.ok_empty_list
            and status == 200
            and response.headers.get("content-type", "").startswith("application/json")
            and response.json().get("data") == []
        )
        if not empty:
            problems.append(f"answered {status}")
    leaked = secret.search(readable(response))
    if leaked:
        problems.append(f"shows bob's content ({leaked.group(0)!r})")
    if after != before:
        changed = [k for k in after if after[k] != before[k]]
        problems.append(f"changed bob's {', '.join(changed)}")
    if not problems:
        return None, after
    snippet = " ".join(response.text.split())[:160]
    return f"{call.describe()}  [{call.route}]: {'; '.join(problems)} — {snippet}", after


def test_every_route_answers_404_for_another_users_ids(cast: Cast) -> None:
    client = cast.client
    bob = build_world(client, cast.bob, "bobsecret", cited=True)
    actors = {
        "mallory": build_world(client, cast.mallory, "mallory", cited=False),
        "admin": build_world(client, cast.admin, "admin", cited=False),
    }
    add_workspace(client, cast.admin, bob, "bob")
    # Bob's search hit URLs (/c/{id}?turn=…#turn-…) are ids too.
    hits = client.get("/v1/search", params={"q": SEARCH}, headers=cast.bob).json()
    hit_urls = sorted({h["url"].split("#")[0] for h in hits["data"]})
    assert hit_urls, "bob's search found none of his own turns"

    offences: list[str] = []
    unknown_routes: set[str] = set()
    covered: set[str] = set()
    before = fingerprint(client, bob)
    for name, actor in actors.items():
        calls, unknown = matrix(client, bob, actor, admin=name == "admin")
        unknown_routes.update(unknown)
        for url in hit_urls:
            path, _, query = url.partition("?")
            params = dict(p.split("=", 1) for p in query.split("&") if p)
            calls.append(Call("GET", path, params=params, route="GET <bob's search hit URL>"))
        for call in calls:
            covered.add(call.route)
            problem, before = attempt(client, call, actor.headers, bob, before)
            if problem:
                offences.append(f"{name}: {problem}")
        # Searching never finds bob's words.
        for url in ("/v1/search", "/ui/search"):
            r = client.get(url, params={"q": SEARCH}, headers=actor.headers)
            if r.status_code >= 500 or SECRET.search(r.text):
                offences.append(
                    f"{name}: GET {url}?q={SEARCH}: {r.status_code}, shows bob's "
                    f"content: {bool(SECRET.search(r.text))}"
                )

    # The matrix reached every kind of id route named in the issue.
    for must in (
        "/v1/conversations/{conv_id:str}/turns/{turn_id:str}/citations",
        "/v1/passages/{chunk_id:int}",
        "/ui/passages/{chunk_id:int}",
        "/ui/c/{conv_id:str}/turns/{turn_id:str}/sources",
        "/ui/library/documents/{doc_id:str}/delete",
        "/ui/c/{conv_id:str}/documents/{doc_id:str}/delete",
        "/v1/users/{user_id:str}/memory/{fact_id:str}",
        "/c/{conv_id:str}",
        "/v1/shares/{share_id:str}",
        "/s/{token:str}",
        "/w/{ws_id:str}",
        "/v1/workspaces/{ws_id:str}/documents",
    ):
        assert any(must in route for route in covered), f"the matrix missed {must}"
    assert not unknown_routes, (
        "routes take ids the matrix cannot fill; teach World.ids their kind:\n  "
        + "\n  ".join(sorted(unknown_routes))
    )
    assert not offences, (
        f"{len(offences)} calls with bob's ids did not answer a clean 404:\n  "
        + "\n  ".join(offences)
    )


def build_workspace_world(cast: Cast, *members: str) -> World:
    """Bob's conversation in a workspace with these members: an attachment (the workspace's),
    a cited answer, and a document of the workspace's library."""
    client, bob = cast.client, cast.bob
    w = World(bob)
    add_workspace(client, cast.admin, w, "bob", *members)
    listed = client.get(f"/v1/workspaces/{w.ws_id}", headers=bob).json()["members"]
    w.user_id = next(m["user_id"] for m in listed if m["name"] == "bob")
    w.conv_id = client.post("/v1/conversations", headers=bob, json={"title": "bobsecret"}).json()[
        "id"
    ]
    r = client.post(
        f"/v1/conversations/{w.conv_id}/workspace", headers=bob, json={"workspace_id": w.ws_id}
    )
    assert r.status_code == 200, r.text
    r = client.post(
        f"/v1/conversations/{w.conv_id}/documents",
        headers=bob,
        files={"file": ("zephyr-manual.txt", MANUAL.encode(), "text/plain")},
    )
    assert r.status_code == 201, r.text
    w.conv_doc = r.json()["id"]
    w.user_turn, w.answer, got = send_turn(client, bob, w.conv_id, QUESTION)
    cites = [e.json() for e in got if e.event == "citations"]
    assert cites, "the workspace conversation cited nothing of the workspace's documents"
    w.chunk_id = int(cites[0]["citations"][0]["chunk_id"])
    r = client.post(
        f"/v1/workspaces/{w.ws_id}/documents",
        headers=bob,
        files={"file": ("team.txt", b"bobsecret team library text. " * 40, "text/plain")},
    )
    assert r.status_code == 201, r.text
    w.library_doc = r.json()["id"]
    return w


def test_workspace_outsiders_and_removed_members_get_404(cast: Cast) -> None:
    """Bob and ann share a workspace conversation; mallory (never a member) and ann, once
    removed, get 404 on every route that takes an id of it, its turns or its documents."""
    client = cast.client
    ann = bearer(seed_user(cast.settings, "ann", role="member", tier="paid"))
    ws = build_workspace_world(cast, "ann")
    # While a member, ann reads it, its citations and the library, and continues it.
    for url in (
        f"/v1/conversations/{ws.conv_id}",
        f"/v1/conversations/{ws.conv_id}/turns/{ws.answer}/citations",
        f"/v1/passages/{ws.chunk_id}",
        f"/v1/workspaces/{ws.ws_id}/documents",
        f"/c/{ws.conv_id}",
    ):
        assert client.get(url, headers=ann).status_code == 200, url
    send_turn(client, ann, ws.conv_id, "ann adds a note")
    actors = {
        "mallory": build_world(client, cast.mallory, "mallory", cited=False),
        "ann": build_world(client, ann, "ann", cited=False),
    }
    r = client.delete(
        f"/v1/workspaces/{ws.ws_id}/members/{actors['ann'].user_id}", headers=cast.bob
    )
    assert r.status_code == 204, r.text
    offences: list[str] = []
    covered: set[str] = set()
    before = fingerprint(client, ws)
    for name, actor in actors.items():
        calls, _ = matrix(client, ws, actor)  # unknown kinds are the main matrix's concern
        for call in calls:
            covered.add(call.route)
            problem, before = attempt(client, call, actor.headers, ws, before)
            if problem:
                offences.append(f"{name}: {problem}")
    for must in (
        "GET /v1/conversations/{conv_id:str}",
        "POST /v1/conversations/{conv_id:str}/turns",
        "GET /v1/conversations/{conv_id:str}/turns/{turn_id:str}/citations",
        "GET /v1/passages/{chunk_id:int}",
        "GET /v1/documents/{doc_id:str}",
        "GET /v1/workspaces/{ws_id:str}/documents",
        "DELETE /v1/workspaces/{ws_id:str}/documents/{doc_id:str}",
        "GET /c/{conv_id:str}",
        "GET /w/{ws_id:str}",
    ):
        assert must in covered, f"the workspace matrix missed {must}"
    assert not offences, (
        f"{len(offences)} calls on a workspace's ids did not answer a clean 404:\n  "
        + "\n  ".join(offences)
    )


# Words only the workspace conversation ann started holds: her own, and a teammate's written
# after she left. A removed member must find neither anywhere.
ANN_WORDS = "walrusannword"
AFTER_WORDS = "quokkaafterword"
WORKSPACE_SECRET = re.compile(rf"bobsecret|zephyr|{ANN_WORDS}|{AFTER_WORDS}", re.IGNORECASE)


def idless_reads(client: TestClient) -> list[str]:
    """Every GET route that takes no id (lists, search, export, pages), from the route table:
    where a conversation could show without being named."""
    return sorted(
        path
        for method, path, params in route_table(client)
        if method == "GET" and not params and not path.startswith(NOT_OWNED)
    )


def test_a_removed_member_loses_the_workspace_on_every_route(cast: Cast) -> None:
    """Ann starts a conversation, moves it into bob's workspace and leaves (bob removes her);
    bob then writes in it. The removed-member column: ann gets 404 on every route of the
    route table with its ids, and no id-less read (search, export, lists, pages) shows any
    of it, her own words there included: it belongs to the workspace she left."""
    client, bob = cast.client, cast.bob
    ann = bearer(seed_user(cast.settings, "ann", role="member", tier="paid"))
    ws = World(bob)  # the workspace's ids; fingerprinted as bob (its owner) sees them
    add_workspace(client, cast.admin, ws, "bob", "ann")
    r = client.post("/v1/conversations", headers=ann, json={"title": "bobsecret plans"})
    ws.conv_id = r.json()["id"]
    r = client.post(
        f"/v1/conversations/{ws.conv_id}/workspace", headers=ann, json={"workspace_id": ws.ws_id}
    )
    assert r.status_code == 200, r.text
    r = client.post(
        f"/v1/conversations/{ws.conv_id}/documents",
        headers=ann,
        files={"file": ("zephyr-manual.txt", MANUAL.encode(), "text/plain")},
    )
    assert r.status_code == 201, r.text
    ws.conv_doc = r.json()["id"]
    send_turn(client, ann, ws.conv_id, f"ann notes {ANN_WORDS} here")
    ws.user_turn, ws.answer, got = send_turn(client, ann, ws.conv_id, QUESTION)
    cites = [e.json() for e in got if e.event == "citations"]
    assert cites, "the workspace conversation cited nothing: the matrix needs a passage id"
    ws.chunk_id = int(cites[0]["citations"][0]["chunk_id"])
    r = client.post(
        f"/v1/workspaces/{ws.ws_id}/documents",
        headers=bob,
        files={"file": ("team.txt", b"bobsecret team library text. " * 40, "text/plain")},
    )
    assert r.status_code == 201, r.text
    ws.library_doc = r.json()["id"]
    own = build_world(client, ann, "ann", cited=False)  # what ann keeps: her own things

    def found(headers: dict[str, str], words: str) -> set[str]:
        r = client.get("/v1/search", params={"q": words}, headers=headers)
        assert r.status_code == 200, r.text
        return {h["conversation_id"] for h in r.json()["data"] if words in h["snippet"]}

    # While a member, ann sees it, finds her words in it and exports it.
    assert found(ann, ANN_WORDS) == {ws.conv_id}
    assert ANN_WORDS in readable(client.get("/v1/users/me/export", headers=ann))
    members = client.get(f"/v1/workspaces/{ws.ws_id}", headers=bob).json()["members"]
    ann_id = next(m["user_id"] for m in members if m["name"] == "ann")
    r = client.delete(f"/v1/workspaces/{ws.ws_id}/members/{ann_id}", headers=bob)
    assert r.status_code == 204, r.text
    send_turn(client, bob, ws.conv_id, f"bob writes {AFTER_WORDS} after ann left")
    # A member who did not start it finds a teammate's words in it: search is what one sees.
    assert found(bob, AFTER_WORDS) == {ws.conv_id}

    offences: list[str] = []
    covered: set[str] = set()
    before = fingerprint(client, ws)
    calls, _ = matrix(client, ws, own)
    for call in calls:
        covered.add(call.route)
        problem, before = attempt(client, call, ann, ws, before, WORKSPACE_SECRET)
        if problem:
            offences.append(f"ann (removed): {problem}")
    reads = idless_reads(client)
    for path in reads:
        for words in (ANN_WORDS, AFTER_WORDS, SEARCH):
            r = client.get(path, params={"q": words}, headers=ann)
            leaked = WORKSPACE_SECRET.search(readable(r).replace(words, ""))  # not the echo
            if r.status_code >= 500 or leaked:
                offences.append(
                    f"ann (removed): GET {path}?q={words}: {r.status_code}"
                    + (f", shows the workspace's {leaked.group(0)!r}" if leaked else "")
                )
    for must in ("/v1/search", "/ui/search", "/v1/users/me/export", "/v1/conversations", "/"):
        assert must in reads, f"the id-less reads missed {must}"
    # Every route of the route table that takes a conversation id is in the column.
    conv_routes = {
        f"{m} {p}"
        for m, p, params in route_table(client)
        if "conv_id" in params and not p.startswith(NOT_OWNED)
    }
    missing = sorted(conv_routes - covered)
    assert not missing, "conversation routes the removed-member column missed:\n  " + "\n  ".join(
        missing
    )
    assert not offences, (
        f"{len(offences)} calls by a removed member did not answer a clean 404 or showed the "
        "workspace's content:\n  " + "\n  ".join(offences)
    )
    # Her own things stay hers: the export is not simply empty.
    exported = readable(client.get("/v1/users/me/export", headers=ann))
    assert own.conv_id in exported and ws.conv_id not in exported
