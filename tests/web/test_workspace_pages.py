"""Workspaces in the browser's pages (tiny model): admins create them and name their owner in
the console (CSRF like every console form); a chat moves into one and says so in its header
and the sidebar; the sidebar lists the user's workspaces; a workspace's library is kept on
its page; outsiders get 404 throughout."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway import Box, gateway_box
from tests.security.conftest import send_turn
from tests.web.test_console import audit_actions, post

pytestmark = pytest.mark.timeout(300)
NOTE = b"# Runbook\n\nRestart the pump with the red lever, then wait ninety seconds.\n" * 4


@pytest.fixture
def box(tmp_path: Path, tiny_gguf: Path) -> Iterator[Box]:
    with gateway_box(tmp_path, tiny_gguf) as b:
        yield b


def team(box: Box, name: str = "Support") -> str:
    """A workspace owned by bob, with carol as a member (over the API); its id."""
    c = box.client
    ws = c.post("/v1/workspaces", headers=box.h("admin"), json={"name": name}).json()["id"]
    for who, role, by in (("bob", "owner", "admin"), ("carol", "member", "bob")):
        r = c.post(
            f"/v1/workspaces/{ws}/members", headers=box.h(by), json={"name": who, "role": role}
        )
        assert r.status_code == 201, r.text
    return str(ws)


def test_admin_creates_a_workspace_and_names_its_owner_in_the_console(box: Box) -> None:
    c = box.client
    csrf = box.login("admin")
    page = c.get("/console/workspaces")
    assert page.status_code == 200 and "No workspaces yet" in page.text
    assert 'href="/console/workspaces"' in c.get("/console/people").text  # in the console nav
    # Without the session's CSRF token nothing is made.
    r = c.post("/console/workspaces", data={"name": "Sneaky", "owner": "bob"})
    assert r.status_code == 403
    # An unknown owner is refused before anything is made.
    r = post(box, "/console/workspaces", csrf, name="Support", owner="nobody")
    assert r.status_code == 422 and "No user named" in r.text  # type: ignore[attr-defined]
    assert "No workspaces yet" in c.get("/console/workspaces").text
    r = post(box, "/console/workspaces", csrf, name="Support", owner="bob", system_prompt="")
    assert r.status_code == 200, r.text  # type: ignore[attr-defined]
    assert "Created Support, owned by bob." in r.text  # type: ignore[attr-defined]
    mine = c.get("/v1/workspaces", headers=box.h("bob")).json()["data"]
    assert [(w["name"], w["role"]) for w in mine] == [("Support", "owner")]
    ws = mine[0]["id"]
    r = post(box, f"/console/workspaces/{ws}/owners", csrf, name="carol")
    assert "carol is now an owner." in r.text  # type: ignore[attr-defined]
    row = re.search(r'<tr data-workspace="Support">.*?</tr>', r.text, re.S)  # type: ignore[attr-defined]
    assert row and "bob, carol" in row.group(0)
    assert {"workspace.create", "workspace.add_member"} <= set(audit_actions(box))
    # The owner can now manage it; a plain member cannot reach the console page.
    r = c.post(f"/v1/workspaces/{ws}/members", headers=box.h("bob"), json={"name": "ann"})
    assert r.status_code == 201
    r = post(box, f"/console/workspaces/{ws}/delete", csrf)
    assert "Deleted Support" in r.text  # type: ignore[attr-defined]
    assert c.get("/v1/workspaces", headers=box.h("bob")).json()["data"] == []
    assert "workspace.delete" in audit_actions(box)
    csrf = box.login("ann")
    assert c.get("/console/workspaces", follow_redirects=False).status_code == 403
    r = post(box, "/console/workspaces", csrf, name="Mine", owner="ann")
    assert r.status_code == 403  # type: ignore[attr-defined]


def test_a_chat_moves_into_a_workspace_and_the_pages_say_so(box: Box) -> None:
    c = box.client
    ws = team(box)
    bob, carol, ann = box.h("bob"), box.h("carol"), box.h("ann")
    conv = box.new_conversation("bob", title="Ticket 7")
    send_turn(c, bob, conv, "the pump is down")
    # The sidebar lists bob's workspaces (a link to each page); ann has none.
    home = c.get("/", headers=bob).text
    assert f'href="/w/{ws}"' in home and "Support" in home
    assert "Your workspaces" not in c.get("/", headers=ann).text
    page = c.get(f"/c/{conv}", headers=bob).text
    assert "Move to workspace" in page and f'<option value="{ws}"' in page
    assert 'data-testid="conv-workspace"' not in page
    r = c.post(f"/ui/c/{conv}/workspace", headers=bob, data={"workspace_id": ws})
    assert r.status_code == 200, r.text
    assert 'data-testid="conv-workspace"' in r.text and f'<option value="{ws}" selected' in r.text
    assert 'class="conv-ws"' in r.text  # the sidebar (out of band) marks it
    # Carol, a member, sees it marked and where it lives; she cannot move, share or delete it.
    page = c.get(f"/c/{conv}", headers=carol).text
    assert 'data-testid="conv-workspace"' in page and f'href="/w/{ws}"' in page
    assert "Move to workspace" not in page and "Delete chat" not in page
    assert 'id="share"' not in page
    assert 'class="conv-ws"' in c.get("/", headers=carol).text
    assert c.post(f"/ui/c/{conv}/workspace", headers=carol, data={}).status_code == 403
    # Ann, outside, gets 404 everywhere.
    assert c.get(f"/c/{conv}", headers=ann).status_code == 404
    assert c.post(f"/ui/c/{conv}/workspace", headers=ann, data={}).status_code == 404
    # Back to personal: carol loses it at once.
    r = c.post(f"/ui/c/{conv}/workspace", headers=bob, data={"workspace_id": ""})
    assert r.status_code == 200 and 'data-testid="conv-workspace"' not in r.text
    assert c.get(f"/c/{conv}", headers=carol).status_code == 404


def test_the_workspace_page_keeps_its_library(box: Box) -> None:
    c = box.client
    ws = team(box)
    bob, carol, ann = box.h("bob"), box.h("carol"), box.h("ann")
    page = c.get(f"/w/{ws}", headers=bob).text
    assert "The workspace's library is empty" in page and "carol" in page
    note = {"file": ("runbook.md", NOTE, "text/markdown")}
    r = c.post(f"/ui/w/{ws}/documents", headers=carol, files=note)
    assert r.status_code == 200, r.text
    assert "Added runbook.md." in r.text
    docs = c.get(f"/v1/workspaces/{ws}/documents", headers=bob).json()["data"]
    assert [d["name"] for d in docs] == ["runbook.md"]
    assert "runbook.md" in c.get(f"/w/{ws}", headers=bob).text
    assert "runbook.md" not in c.get("/library", headers=bob).text  # not bob's own library
    # Outsiders: 404 for the page, the upload and the delete.
    assert c.get(f"/w/{ws}", headers=ann).status_code == 404
    assert c.post(f"/ui/w/{ws}/documents", headers=ann, files=note).status_code == 404
    doc = docs[0]["id"]
    assert c.post(f"/ui/w/{ws}/documents/{doc}/delete", headers=ann).status_code == 404
    # A refused file says why, inline.
    r = c.post(
        f"/ui/w/{ws}/documents",
        headers={**bob, "HX-Request": "true"},
        files={"file": ("empty.md", b"", "text/markdown")},
    )
    assert r.status_code >= 400 and "Not added to the workspace" in r.text
    # Any member deletes any of its documents.
    r = c.post(f"/ui/w/{ws}/documents/{doc}/delete", headers=bob)
    assert r.status_code == 200 and "Deleted runbook.md." in r.text
    assert c.get(f"/v1/workspaces/{ws}/documents", headers=carol).json()["data"] == []


def test_a_new_chat_starts_in_a_workspace_only_for_its_members(box: Box) -> None:
    c = box.client
    ws = team(box)
    bob, carol, ann = box.h("bob"), box.h("carol"), box.h("ann")
    assert 'data-testid="ws-new-chat"' in c.get(f"/w/{ws}", headers=bob).text
    page = c.get(f"/?workspace={ws}", headers=bob)
    assert page.status_code == 200 and f'name="workspace_id" value="{ws}"' in page.text
    r = c.post("/ui/new/send", headers=bob, data={"content": "pump check", "workspace_id": ws})
    assert r.status_code == 200, r.text
    conv = r.headers["HX-Push-Url"].rsplit("/", 1)[-1]
    assert 'data-testid="conv-workspace"' in r.text
    assert c.get(f"/c/{conv}", headers=carol).status_code == 200  # a teammate reads it
    # An outsider can neither open such a page nor start a chat there; nothing is left behind.
    assert c.get(f"/?workspace={ws}", headers=ann).status_code == 404
    before = c.get("/v1/conversations", headers=ann).json()["data"]
    r = c.post("/ui/new/send", headers=ann, data={"content": "sneak in", "workspace_id": ws})
    assert r.status_code == 404
    assert c.get("/v1/conversations", headers=ann).json()["data"] == before
