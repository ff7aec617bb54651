"""A removed workspace member against `chatbox serve` as shipped: after the owner removes
them and a teammate writes in the conversation they started, their search (API and sidebar)
finds nothing of it and their export holds none of it, while their own chats stay theirs."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import httpx
import pytest

from tests.served import Served

pytestmark = pytest.mark.timeout(600)

ANN_WORDS = "walrusannword"  # ann's own words, in the conversation she starts in the workspace
AFTER_WORDS = "quokkaafterword"  # bob's, written there after ann is removed
OWN_WORDS = "pelicanownword"  # ann's, in a personal chat she keeps


def say(box: Served, key: str, conv: str, text: str) -> None:
    """Send a message and read its answer's stream to the end."""
    r = httpx.post(
        f"{box.url}/v1/conversations/{conv}/turns",
        headers=box.auth(key),
        json={"content": text, "max_tokens": 4},
        timeout=120,
    )
    assert r.status_code == 200 and "event: done" in r.text, r.text[-500:]


def export_text(box: Served, key: str) -> str:
    r = httpx.get(f"{box.url}/v1/users/me/export", headers=box.auth(key), timeout=120)
    assert r.status_code == 200, r.text
    with zipfile.ZipFile(io.BytesIO(r.content)) as zf:
        return "\n".join(zf.read(n).decode(errors="replace") for n in zf.namelist())


def hits(box: Served, key: str, words: str) -> str:
    """What ann's searches show for these words (the API's hits and the sidebar's HTML)."""
    api = httpx.get(f"{box.url}/v1/search", params={"q": words}, headers=box.auth(key), timeout=120)
    ui = httpx.get(f"{box.url}/ui/search", params={"q": words}, headers=box.auth(key), timeout=120)
    assert api.status_code == 200 and ui.status_code == 200, (api.text, ui.text)
    return str(api.json()["data"]) + ui.text


def test_removed_member_searches_and_exports_nothing_of_the_workspace(
    tmp_path: Path, tiny_gguf: Path
) -> None:
    with Served(tmp_path, model=tiny_gguf) as box:
        ann, bob = box.user("ann"), box.user("bob")
        box.cli("workspaces", "create", "Support", "--owner", "bob")
        box.cli("workspaces", "add-member", "Support", "ann")
        api = httpx.Client(base_url=box.url, timeout=120)
        ws = api.get("/v1/workspaces", headers=box.auth(bob)).json()["data"][0]["id"]
        conv = api.post("/v1/conversations", headers=box.auth(ann), json={}).json()["id"]
        r = api.post(
            f"/v1/conversations/{conv}/workspace",
            headers=box.auth(ann),
            json={"workspace_id": ws},
        )
        assert r.status_code == 200, r.text
        say(box, ann, conv, f"ann writes {ANN_WORDS}")
        mine = api.post("/v1/conversations", headers=box.auth(ann), json={}).json()["id"]
        say(box, ann, mine, f"ann keeps {OWN_WORDS}")
        assert ANN_WORDS in hits(box, ann, ANN_WORDS)  # while a member she finds it
        members = api.get(f"/v1/workspaces/{ws}", headers=box.auth(bob)).json()["members"]
        ann_id = next(m["user_id"] for m in members if m["name"] == "ann")
        r = api.delete(f"/v1/workspaces/{ws}/members/{ann_id}", headers=box.auth(bob))
        assert r.status_code == 204, r.text
        say(box, bob, conv, f"bob writes {AFTER_WORDS} after ann left")

        assert api.get(f"/v1/conversations/{conv}", headers=box.auth(ann)).status_code == 404
        for words in (AFTER_WORDS, ANN_WORDS):
            shown = hits(box, ann, words).replace(words, "")  # not the query's echo in links
            assert AFTER_WORDS not in shown and ANN_WORDS not in shown and conv not in shown
        exported = export_text(box, ann)
        assert conv not in exported
        assert AFTER_WORDS not in exported and ANN_WORDS not in exported
        assert OWN_WORDS in exported and mine in exported  # her own chat stays hers
        assert AFTER_WORDS in hits(box, bob, AFTER_WORDS)  # bob, still a member, finds it
