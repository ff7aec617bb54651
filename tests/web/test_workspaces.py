"""Workspaces: members read and continue shared conversations; everyone else gets 404."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from litestar.testing import TestClient

from chatbox.app import create_app
from chatbox.catalog.registry import ModelRegistry
from chatbox.settings import Settings
from tests.conftest import bearer, seed_user
from tests.security.conftest import send_turn

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def team(settings: Settings, registry: ModelRegistry) -> Iterator[tuple[TestClient, dict]]:
    people = {"admin": bearer(seed_user(settings))}
    for name in ("owen", "mia", "nick"):
        people[name] = bearer(seed_user(settings, name, role="member", tier="paid"))
    with TestClient(create_app(settings, registry), timeout=120) as client:
        yield client, people


def routes(conv: str, turn: str) -> list[tuple[str, str]]:
    return [
        ("GET", f"/v1/conversations/{conv}"),
        ("PATCH", f"/v1/conversations/{conv}"),
        ("GET", f"/v1/conversations/{conv}/turns/{turn}/citations"),
        ("POST", f"/v1/conversations/{conv}/turns"),
        ("GET", f"/c/{conv}"),
    ]


def call(client: TestClient, method: str, url: str, headers: dict) -> int:
    body = {"content": "pwned", "max_tokens": 2} if url.endswith("/turns") else {"title": "x"}
    kw = {"json": body} if method in ("POST", "PATCH") else {}
    return client.request(method, url, headers=headers, follow_redirects=False, **kw).status_code


def test_members_share_and_outsiders_get_404(team) -> None:  # type: ignore[no-untyped-def]
    client, p = team
    r = client.post("/v1/workspaces", headers=p["admin"], json={"name": "Support team"})
    assert r.status_code == 201, r.text
    ws = r.json()["id"]
    assert client.post("/v1/workspaces", headers=p["owen"], json={"name": "x"}).status_code == 403
    r = client.post(
        f"/v1/workspaces/{ws}/members", headers=p["admin"], json={"name": "owen", "role": "owner"}
    )
    assert r.status_code == 201, r.text
    r = client.post(f"/v1/workspaces/{ws}/members", headers=p["owen"], json={"name": "mia"})
    assert r.status_code == 201, r.text
    conv = client.post("/v1/conversations", headers=p["owen"], json={"title": "Ticket 42"}).json()[
        "id"
    ]
    _, answer, _ = send_turn(client, p["owen"], conv, "owen asks first")
    # Outsiders (nick) cannot move it or see the workspace.
    assert client.get(f"/v1/workspaces/{ws}", headers=p["nick"]).status_code == 404
    assert client.get(f"/w/{ws}", headers=p["nick"]).status_code == 404
    r = client.post(
        f"/v1/conversations/{conv}/workspace", headers=p["owen"], json={"workspace_id": ws}
    )
    assert r.status_code == 200, r.text
    # Mia continues owen's conversation; each turn records its author.
    assert client.get(f"/v1/conversations/{conv}", headers=p["mia"]).status_code == 200
    send_turn(client, p["mia"], conv, "mia follows up")
    store = client.app.state.services.store

    async def authors() -> list[tuple[str, str | None]]:
        conv_row = await store.conversations.get(p_ids["owen"], conv)
        path = await store.turns.path(conv, conv_row.active_leaf_id)
        return [(t.content, t.author_id) for t in path if t.role == "user"]

    async def ids() -> dict[str, str]:
        return {n: (await store.users.get_by_name(n)).id for n in ("owen", "mia", "nick")}

    p_ids = client.blocking_portal.call(ids)
    assert client.blocking_portal.call(authors) == [
        ("owen asks first", p_ids["owen"]),
        ("mia follows up", p_ids["mia"]),
    ]
    listed = client.get(f"/v1/workspaces/{ws}", headers=p["mia"]).json()
    assert [c["id"] for c in listed["conversations"]] == [conv]
    # The isolation matrix: non-member and, after removal, the removed member.
    for method, url in routes(conv, answer):
        assert call(client, method, url, p["nick"]) == 404, (method, url)
        assert call(client, "GET", f"/v1/conversations/{conv}", p["admin"]) == 404
    assert conv not in [
        c["id"] for c in client.get("/v1/conversations", headers=p["nick"]).json()["data"]
    ]
    r = client.delete(f"/v1/workspaces/{ws}/members/{p_ids['mia']}", headers=p["owen"])
    assert r.status_code == 204
    for method, url in routes(conv, answer):
        assert call(client, method, url, p["mia"]) == 404, (method, url)
    assert client.get(f"/v1/workspaces/{ws}", headers=p["mia"]).status_code == 404
    # A member cannot delete what another started; the admin deleting the workspace erases it.
    r = client.delete(f"/v1/workspaces/{ws}", headers=p["admin"])
    assert r.status_code == 204
    assert client.get(f"/v1/conversations/{conv}", headers=p["owen"]).status_code == 404


def test_settings_are_the_starters_or_a_workspace_owners(team) -> None:  # type: ignore[no-untyped-def]
    """Title, system prompt and model: the member who started a workspace conversation or an
    owner of the workspace changes them; another member gets 403 (they see it) and the
    page offers them no settings form. Deleting, moving and sharing stay the starter's."""
    client, p = team
    ws = client.post("/v1/workspaces", headers=p["admin"], json={"name": "Docs team"}).json()["id"]
    for name, role in (("owen", "owner"), ("mia", "member")):
        r = client.post(
            f"/v1/workspaces/{ws}/members", headers=p["admin"], json={"name": name, "role": role}
        )
        assert r.status_code == 201, r.text

    def started_by(who: str, title: str) -> str:
        conv = client.post("/v1/conversations", headers=p[who], json={"title": title}).json()["id"]
        r = client.post(
            f"/v1/conversations/{conv}/workspace", headers=p[who], json={"workspace_id": ws}
        )
        assert r.status_code == 200, r.text
        return str(conv)

    owens, mias = started_by("owen", "owen's plan"), started_by("mia", "mia's plan")
    for change in ({"title": "mia was here"}, {"system_prompt": "obey mia"}, {"model": "tiny"}):
        r = client.patch(f"/v1/conversations/{owens}", headers=p["mia"], json=change)
        assert r.status_code == 403, (change, r.status_code, r.text)
    r = client.post(f"/ui/c/{owens}/settings", headers=p["mia"], data={"title": "mia was here"})
    assert r.status_code == 403, r.text
    seen = client.get(f"/v1/conversations/{owens}", headers=p["owen"]).json()
    assert (seen["title"], seen["system_prompt"]) == ("owen's plan", None)
    page = client.get(f"/c/{owens}", headers=p["mia"]).text
    assert 'data-testid="settings-locked"' in page and f"/ui/c/{owens}/settings" not in page
    for method, url, body in (
        ("DELETE", f"/v1/conversations/{owens}", None),
        ("POST", f"/v1/conversations/{owens}/shares", {}),
        ("POST", f"/v1/conversations/{owens}/workspace", {"workspace_id": None}),
    ):
        r = client.request(method, url, headers=p["mia"], json=body)
        assert r.status_code == 403, (method, url, r.status_code, r.text)
    # The workspace's owner sets what a member started; the starter sets their own.
    r = client.patch(
        f"/v1/conversations/{mias}",
        headers=p["owen"],
        json={"title": "Reviewed plan", "system_prompt": "Be brief."},
    )
    assert r.status_code == 200, r.text
    assert (r.json()["title"], r.json()["system_prompt"]) == ("Reviewed plan", "Be brief.")
    assert client.delete(f"/v1/conversations/{mias}", headers=p["owen"]).status_code == 403
    r = client.patch(f"/v1/conversations/{mias}", headers=p["mia"], json={"title": "mia's again"})
    assert r.status_code == 200 and r.json()["title"] == "mia's again", r.text
    assert 'data-testid="settings-locked"' not in client.get(f"/c/{mias}", headers=p["owen"]).text
