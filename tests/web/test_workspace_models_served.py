"""A workspace conversation answers each member with a model their own tier allows: the paid
owner who started it on the paid model gets that model, a free member who continues it gets
the free tier's model (in the answer, and in the picker their page shows)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from tests.conftest import _answers_unchecked
from tests.served import Served

pytestmark = pytest.mark.timeout(600)


def _ask(client: httpx.Client, key: str, conv: str, text: str) -> None:
    r = client.post(
        f"/v1/conversations/{conv}/turns",
        headers=Served.auth(key),
        json={"content": text, "max_tokens": 4},
    )
    assert r.status_code == 200, r.text
    assert "event: done" in r.text, r.text[-500:]


def test_a_free_member_is_answered_by_the_free_tiers_model(tmp_path: Path, tiny_gguf: Path) -> None:
    # The shipped policy with each tier on its own copy of the tiny model.
    policy = _answers_unchecked(None, tmp_path)
    text = policy.read_text().replace('"smollm2"', '"tiny"').replace('"gemma3-270m"', '"paid"')
    policy.write_text(text)
    box = Served(tmp_path, model=tiny_gguf, policy=policy)
    box.cli("models", "add", str(tiny_gguf), "--name", "paid", "--link")
    owner = box.user("pat", tier="paid")
    member = box.user("fay", tier="free")
    with box, httpx.Client(base_url=box.url, timeout=180) as c:
        ws = c.post("/v1/workspaces", headers=box.admin, json={"name": "Support"}).json()["id"]
        for who, role, key in (("pat", "owner", box.admin_key), ("fay", "member", owner)):
            r = c.post(
                f"/v1/workspaces/{ws}/members",
                headers=Served.auth(key),
                json={"name": who, "role": role},
            )
            assert r.status_code == 201, r.text
        r = c.post(
            "/v1/conversations",
            headers=Served.auth(owner),
            json={"title": "Ticket 42", "model": "paid"},
        )
        conv = r.json()["id"]
        r = c.post(
            f"/v1/conversations/{conv}/workspace",
            headers=Served.auth(owner),
            json={"workspace_id": ws},
        )
        assert r.status_code == 200, r.text

        _ask(c, owner, conv, "pat asks first")
        _ask(c, member, conv, "fay follows up")
        view = c.get(f"/v1/conversations/{conv}", headers=Served.auth(member)).json()
        answered_by = [t["model"] for t in view["turns"] if t["role"] == "assistant"]
        assert answered_by == ["paid", "tiny"]

        # Each one's page shows the model their next turn gets.
        picked = re.compile(r'<option value="([^"]+)" selected>')
        page = c.get(f"/c/{conv}", headers=Served.auth(member)).text
        assert picked.findall(page.split('id="model-picker"')[1])[:1] == ["tiny"]
        page = c.get(f"/c/{conv}", headers=Served.auth(owner)).text
        assert picked.findall(page.split('id="model-picker"')[1])[:1] == ["paid"]
