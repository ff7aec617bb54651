"""Share links: anonymous read-only snapshots, revocation, immutability, continue, policy."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from litestar.testing import TestClient

from chatbox.app import create_app
from chatbox.catalog.registry import ModelRegistry
from chatbox.settings import Settings
from tests.conftest import bearer, seed_user, store_holding
from tests.security.conftest import send_turn

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def app(settings: Settings, registry: ModelRegistry) -> Iterator[tuple[TestClient, dict, dict]]:
    owner = bearer(seed_user(settings, "olive", role="member", tier="paid"))
    reader = bearer(seed_user(settings, "rita", role="member", tier="paid"))
    with TestClient(create_app(settings, registry), timeout=120) as client:
        yield client, owner, reader


def anonymous(client: TestClient, url: str) -> object:
    client.headers.pop("Authorization", None)
    return client.get(url, follow_redirects=False)


def test_link_is_readable_anonymously_and_shows_only_the_shared_turns(app) -> None:  # type: ignore[no-untyped-def]
    client, owner, _ = app
    conv = client.post("/v1/conversations", headers=owner, json={"title": "Trip plan"}).json()["id"]
    _, first_a, _ = send_turn(client, owner, conv, "first question about alpacas")
    send_turn(client, owner, conv, "second question about llamas")
    r = client.patch("/v1/users/me/memory", headers=owner, json={"add": ["owner secret ferret"]})
    assert r.status_code == 200
    r = client.post(
        f"/v1/conversations/{conv}/shares", headers=owner, json={"upto_turn_id": first_a}
    )
    assert r.status_code == 201, r.text
    link = r.json()
    assert link["turns"] == 2 and len(link["token"]) >= 32
    page = anonymous(client, link["url"])
    assert page.status_code == 200, page.text
    assert "first question about alpacas" in page.text
    assert "llamas" not in page.text  # only up to the chosen turn
    assert "ferret" not in page.text  # no memory
    assert '<meta name="robots" content="noindex' in page.text
    assert page.headers["x-robots-tag"].startswith("noindex")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    # The token is not stored: the database holds only its hash.
    assert store_holding(client, link["token"]) == []
    # A wrong token is a 404.
    assert anonymous(client, link["url"][:-2] + "xx").status_code == 404


def test_markdown_in_a_snapshot_is_sanitised(app) -> None:  # type: ignore[no-untyped-def]
    client, owner, _ = app
    conv = client.post("/v1/conversations", headers=owner, json={}).json()["id"]
    send_turn(client, owner, conv, "<script>alert(1)</script> <img src=x onerror=alert(2)>")
    link = client.post(f"/v1/conversations/{conv}/shares", headers=owner).json()
    page = anonymous(client, link["url"])
    assert page.status_code == 200
    assert "<script>alert(1)" not in page.text and "<img src=x" not in page.text
    assert "&lt;script&gt;alert(1)" in page.text  # shown as text


def test_revoked_link_is_404_at_once(app) -> None:  # type: ignore[no-untyped-def]
    client, owner, reader = app
    conv = client.post("/v1/conversations", headers=owner, json={}).json()["id"]
    send_turn(client, owner, conv, "hello there")
    link = client.post(f"/v1/conversations/{conv}/shares", headers=owner).json()
    listed = client.get("/v1/shares", headers=owner).json()["data"]
    assert [s["id"] for s in listed] == [link["id"]] and "token" not in listed[0]
    # Someone else cannot see or revoke it.
    assert client.get(f"/v1/conversations/{conv}/shares", headers=reader).status_code == 404
    assert client.delete(f"/v1/shares/{link['id']}", headers=reader).status_code == 404
    assert client.delete(f"/v1/shares/{link['id']}", headers=owner).status_code == 204
    assert anonymous(client, link["url"]).status_code == 404
    assert client.get("/v1/shares", headers=owner).json()["data"] == []


def test_snapshot_unchanged_after_edit_and_delete(app) -> None:  # type: ignore[no-untyped-def]
    client, owner, _ = app
    conv = client.post("/v1/conversations", headers=owner, json={}).json()["id"]
    q, _, _ = send_turn(client, owner, conv, "original wording of the question")
    link = client.post(f"/v1/conversations/{conv}/shares", headers=owner).json()
    before = anonymous(client, link["url"]).text
    r = client.post(
        f"/v1/conversations/{conv}/turns/{q}/edit",
        headers=owner,
        json={"content": "edited wording", "max_tokens": 4},
    )
    assert r.status_code == 200
    client.patch(f"/v1/conversations/{conv}", headers=owner, json={"title": "renamed"})
    after = anonymous(client, link["url"])
    assert after.status_code == 200 and after.text == before
    assert "original wording" in after.text and "edited wording" not in after.text
    # Deleting the conversation keeps the link unless asked to revoke it too.
    assert client.delete(f"/v1/conversations/{conv}", headers=owner).status_code == 204
    assert anonymous(client, link["url"]).text == before
    conv2 = client.post("/v1/conversations", headers=owner, json={}).json()["id"]
    send_turn(client, owner, conv2, "second chat")
    link2 = client.post(f"/v1/conversations/{conv2}/shares", headers=owner).json()
    r = client.delete(f"/v1/conversations/{conv2}?revoke_links=true", headers=owner)
    assert r.status_code == 204
    assert anonymous(client, link2["url"]).status_code == 404


def test_continue_copies_into_the_readers_account(app) -> None:  # type: ignore[no-untyped-def]
    client, owner, reader = app
    conv = client.post("/v1/conversations", headers=owner, json={"title": "Recipe"}).json()["id"]
    send_turn(client, owner, conv, "how do I bake bread")
    link = client.post(f"/v1/conversations/{conv}/shares", headers=owner).json()
    # Logged out: continuing asks for a login first.
    assert anonymous(client, link["url"] + "/continue").status_code in (302, 303)
    r = client.post(link["url"] + "/continue", headers=reader)
    assert r.status_code == 200, r.text
    mine = client.get("/v1/conversations", headers=reader).json()["data"]
    assert len(mine) == 1 and mine[0]["id"] != conv and "Recipe" in mine[0]["title"]
    view = client.get(f"/v1/conversations/{mine[0]['id']}", headers=reader).json()
    assert view["turns"][0]["content"] == "how do I bake bread"
    # The reader can continue it; the owner's conversation is untouched.
    send_turn(client, reader, mine[0]["id"], "and with rye?")
    owners = client.get(f"/v1/conversations/{conv}", headers=owner).json()["turns"]
    assert len(owners) == 2


def test_sharing_off_for_a_tier(data_dir, registry) -> None:  # type: ignore[no-untyped-def]
    from tests.conftest import test_settings

    policy = data_dir.parent / "no-sharing.toml"
    policy.parent.mkdir(parents=True, exist_ok=True)
    policy.write_text("[tiers.free]\nsharing = false\n[tiers.paid]\n")
    settings = test_settings(data_dir, policy_path=policy)
    free = bearer(seed_user(settings, "fred", role="member", tier="free"))
    paid = bearer(seed_user(settings, "paula", role="member", tier="paid"))
    with TestClient(create_app(settings, registry), timeout=120) as client:
        for headers, status in ((free, 403), (paid, 201)):
            conv = client.post("/v1/conversations", headers=headers, json={}).json()["id"]
            send_turn(client, headers, conv, "hi")
            r = client.post(f"/v1/conversations/{conv}/shares", headers=headers)
            assert r.status_code == status, r.text


def test_deleting_a_chat_in_the_browser_asks_about_its_links(app) -> None:  # type: ignore[no-untyped-def]
    client, owner, reader = app
    hx = {**owner, "HX-Request": "true"}

    def shared_chat(text: str) -> tuple[str, str]:
        conv = client.post("/v1/conversations", headers=owner, json={}).json()["id"]
        send_turn(client, owner, conv, text)
        return conv, client.post(f"/v1/conversations/{conv}/shares", headers=owner).json()["url"]

    # No links: a plain confirmation.
    lone = client.post("/v1/conversations", headers=owner, json={}).json()["id"]
    dialog = client.get(f"/ui/c/{lone}/delete", headers=hx).text
    assert "This cannot be undone" in dialog and "revoke" not in dialog
    # Someone else's chat: no dialog at all.
    assert client.get(f"/ui/c/{lone}/delete", headers=reader).status_code == 404
    # With a live link the dialog offers both choices.
    kept, kept_url = shared_chat("a chat whose link outlives it")
    dialog = client.get(f"/ui/c/{kept}/delete", headers=hx).text
    assert "1 live share link" in dialog
    assert "Delete and revoke links" in dialog and "Delete, keep links" in dialog
    r = client.post(f"/ui/c/{kept}/delete", headers=hx, data={"revoke_links": "false"})
    assert r.status_code == 200 and r.headers["hx-redirect"] == "/"
    assert client.get(f"/v1/conversations/{kept}", headers=owner).status_code == 404
    page = anonymous(client, kept_url)
    assert page.status_code == 200 and "a chat whose link outlives it" in page.text
    client.headers.update(owner)
    gone, gone_url = shared_chat("a chat whose link goes with it")
    r = client.post(f"/ui/c/{gone}/delete", headers=hx, data={"revoke_links": "true"})
    assert r.status_code == 200
    assert client.get(f"/v1/conversations/{gone}", headers=owner).status_code == 404
    assert anonymous(client, gone_url).status_code == 404
    client.headers.update(owner)
    assert [s["conversation_id"] for s in client.get("/v1/shares").json()["data"]] == [kept]


def test_share_panel_makes_lists_and_revokes_links(app) -> None:  # type: ignore[no-untyped-def]
    client, owner, reader = app
    hx = {**owner, "HX-Request": "true"}
    conv = client.post("/v1/conversations", headers=owner, json={}).json()["id"]
    send_turn(client, owner, conv, "what the panel shares")
    panel = client.get(f"/ui/c/{conv}/shares", headers=hx).text
    assert "No live links" in panel and "Create a link" in panel
    made = client.post(f"/ui/c/{conv}/shares", headers=hx).text
    url = re.search(r'class="share-url" readonly value="([^"]+)"', made)
    assert url and url.group(1).startswith("http") and "/s/" in url.group(1), made
    assert "2 messages" in made
    share_id = client.get("/v1/shares", headers=owner).json()["data"][0]["id"]
    # Only the chat's starter reaches its panel or revokes its links.
    assert client.get(f"/ui/c/{conv}/shares", headers=reader).status_code == 404
    assert client.post(f"/ui/c/{conv}/shares", headers=reader).status_code == 404
    r = client.post(f"/ui/c/{conv}/shares/{share_id}/revoke", headers=reader)
    assert r.status_code == 404
    path = url.group(1)[url.group(1).index("/s/") :]
    assert anonymous(client, path).status_code == 200
    client.headers.update(owner)
    after = client.post(f"/ui/c/{conv}/shares/{share_id}/revoke", headers=hx).text
    assert "Link revoked" in after and "No live links" in after
    assert anonymous(client, path).status_code == 404


def test_deleting_the_account_makes_its_links_404(app) -> None:  # type: ignore[no-untyped-def]
    client, owner, reader = app
    conv = client.post("/v1/conversations", headers=owner, json={}).json()["id"]
    send_turn(client, owner, conv, "shared before the account went")
    link = client.post(f"/v1/conversations/{conv}/shares", headers=owner).json()
    theirs = client.post("/v1/conversations", headers=reader, json={}).json()["id"]
    send_turn(client, reader, theirs, "someone else's link")
    other = client.post(f"/v1/conversations/{theirs}/shares", headers=reader).json()
    assert anonymous(client, link["url"]).status_code == 200
    r = client.post("/v1/users/me/delete", headers=owner, json={"confirm": "olive"})
    assert r.status_code == 204, r.text
    assert anonymous(client, link["url"]).status_code == 404
    assert anonymous(client, link["url"] + "/continue").status_code in (302, 303, 404)
    # Only that account's links: another user's stays readable.
    assert anonymous(client, other["url"]).status_code == 200
    client.blocking_portal.call(client.app.state.services.store.db.checkpoint)
    assert store_holding(client, "shared before the account went") == []
