"""Moderation in the running app (tiny model): a refused message stores nothing and never
reaches the engine; an answer that crosses the line is cut, stored `filtered` and signalled
over SSE and the OpenAI API; documents and facts are screened; the queue is admin-only and
audited; /v1/moderations answers in OpenAI's shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from click.testing import CliRunner
from litestar.testing import TestClient

import chatbox.chat.service as chat_service
from chatbox.app import create_app
from chatbox.catalog.registry import ModelRegistry
from chatbox.chat.policy import default_policy_path
from chatbox.cli import main
from chatbox.moderation import Moderator, Verdict
from chatbox.settings import Settings
from tests.conftest import LiveServer, bearer, seed_user, store_env, test_settings
from tests.sse import Event, parse_sse

EXTRA = """
[moderation]
window_tokens = 8
stride_tokens = 4
[[moderation.rules]]
name = "codename"
terms = ["project nightjar"]
category = "confidential"
action = "block"
"""


@pytest.fixture
def mod_settings(data_dir: Path) -> Settings:
    policy = data_dir.parent / "policy.toml"
    policy.parent.mkdir(parents=True, exist_ok=True)
    text = default_policy_path().read_text()
    text = text[: text.index("[moderation]")] + EXTRA  # the shipped policy, short windows
    policy.write_text(text)
    return test_settings(data_dir, policy_path=policy, max_tokens=24, check_answers=True)


@pytest.fixture
def box(mod_settings: Settings, registry: ModelRegistry) -> Iterator[tuple[TestClient, str]]:
    """(client as the admin, a member's API key)."""
    admin = seed_user(mod_settings)
    member = seed_user(mod_settings, "ann", role="member", tier="free")
    with TestClient(create_app(mod_settings, registry), timeout=60) as c:
        c.headers.update(bearer(admin))
        yield c, member


def events(response: Any) -> list[Event]:
    return list(parse_sse(iter(response.text.split("\n"))))


def cut_every_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any answer window crosses the line (inputs are checked for real)."""
    real = Moderator.check

    async def check(
        self: Moderator, text: str, tier: str, direction: str, *args: Any, **kwargs: Any
    ) -> Verdict:
        if direction == "output":
            return Verdict("block", "violence", {"violence": 0.99}, {"violence": "block"})
        return await real(self, text, tier, direction, *args, **kwargs)

    monkeypatch.setattr(Moderator, "check", check)


def test_a_blocked_message_stores_nothing_and_never_reaches_the_engine(
    box: tuple[TestClient, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, member = box
    submitted: list[object] = []
    real_submit = chat_service.submit
    monkeypatch.setattr(
        chat_service, "submit", lambda *a, **k: submitted.append(a) or real_submit(*a, **k)
    )
    ann = bearer(member)
    conv = client.post("/v1/conversations", json={}, headers=ann).json()["id"]
    refused = client.post(
        f"/v1/conversations/{conv}/turns",
        json={"content": "how do I cook meth in my garage"},
        headers=ann,
    )
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["type"] == "content_filter" and error["category"] == "illicit"
    assert "wasn't sent" in error["message"]
    assert submitted == []
    assert client.get(f"/v1/conversations/{conv}", headers=ann).json()["turns"] == []
    # The admin's rule blocks too; an ordinary message then goes through.
    rule = client.post(
        f"/v1/conversations/{conv}/turns",
        json={"content": "status of Project Nightjar?"},
        headers=ann,
    )
    assert rule.status_code == 400 and rule.json()["error"]["category"] == "confidential"
    ok = client.post(f"/v1/conversations/{conv}/turns", json={"content": "hello"}, headers=ann)
    assert ok.status_code == 200 and len(submitted) == 1
    # The queue records that it happened, without the text.
    items = client.get("/v1/admin/moderation/").json()["data"]
    assert {i["category"] for i in items} >= {"illicit", "confidential"}
    shown = client.get(f"/v1/admin/moderation/{items[-1]['id']}").json()
    assert shown["text"] is None and shown["user"]["name"] == "ann"


def test_self_harm_gets_a_supportive_answer(box: tuple[TestClient, str]) -> None:
    client, member = box
    conv = client.post("/v1/conversations", json={}, headers=bearer(member)).json()["id"]
    r = client.post(
        f"/v1/conversations/{conv}/turns",
        json={"content": "I want to kill myself tonight"},
        headers=bearer(member),
    )
    assert r.status_code == 400
    assert "988" in r.json()["error"]["message"] and "alone" in r.json()["error"]["message"]


def test_an_answer_crossing_the_line_is_cut_stored_filtered_and_signalled(
    box: tuple[TestClient, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _ = box
    cut_every_answer(monkeypatch)
    conv = client.post("/v1/conversations", json={}).json()["id"]
    r = client.post(f"/v1/conversations/{conv}/turns", json={"content": "tell me a story"})
    got = events(r)
    kinds = [e.event for e in got]
    assert "moderation" in kinds
    mod = got[kinds.index("moderation")].json()
    assert mod["action"] == "block" and mod["category"] == "violence" and mod["message"]
    done = got[-1].json()
    assert got[-1].event == "done"
    assert done["status"] == "filtered" and done["finish_reason"] == "content_filter"
    # Cut within a window: nothing after the block is sent, well before max_tokens (24).
    assert kinds.index("moderation") > kinds.index("token")
    assert all(k != "token" for k in kinds[kinds.index("moderation") :])
    assert kinds.count("token") < 24
    turn = client.get(f"/v1/conversations/{conv}").json()["turns"][-1]
    assert turn["status"] == "filtered" and turn["content"] == mod["message"]
    # The UI's streaming bubble: the notice replaces the text, then the filtered turn.
    ui = events(client.get(f"/ui/c/{conv}/turns/{turn['id']}/stream"))
    notes = [e.data for e in ui if e.event == "html" and "moderation-note" in e.data]
    assert notes and "This answer was stopped" in notes[-1]
    assert ui[-1].event == "done" and 'data-status="filtered"' in ui[-1].data
    item = client.get("/v1/admin/moderation/").json()["data"][0]
    assert item["direction"] == "output" and item["turn_id"] == turn["id"]
    assert client.get(f"/v1/admin/moderation/{item['id']}").json()["text"]  # kept for review


def test_documents_and_facts_are_screened_before_they_are_kept(
    box: tuple[TestClient, str],
) -> None:
    client, member = box
    ann = bearer(member)
    bad = b"Chapter 1. Step one: how to synthesize mdma in a home lab and sell it to students."
    r = client.post("/v1/documents", headers=ann, files={"file": ("notes.txt", bad, "text/plain")})
    assert r.status_code == 422 and "notes.txt was not added" in r.json()["error"]["message"]
    assert client.get("/v1/documents", headers=ann).json()["data"] == []
    refused = client.patch(
        "/v1/users/me/memory", headers=ann, json={"add": ["how to make a pipe bomb"]}
    )
    assert refused.status_code == 422
    assert client.get("/v1/users/me/memory", headers=ann).json()["data"] == []
    kept = client.patch("/v1/users/me/memory", headers=ann, json={"add": ["I live in Lisbon"]})
    assert kept.status_code == 200
    assert len(client.get("/v1/users/me/memory", headers=ann).json()["data"]) == 1


def test_the_queue_is_admin_only_and_every_view_and_resolution_is_audited(
    box: tuple[TestClient, str], mod_settings: Settings
) -> None:
    client, member = box
    ann = bearer(member)
    conv = client.post("/v1/conversations", json={}, headers=ann).json()["id"]
    client.post(
        f"/v1/conversations/{conv}/turns", json={"content": "how do I cook meth"}, headers=ann
    )
    item = client.get("/v1/admin/moderation/").json()["data"][0]
    assert client.get("/v1/admin/moderation/", headers=ann).status_code == 403
    assert client.get(f"/v1/admin/moderation/{item['id']}", headers=ann).status_code == 403
    assert client.get("/admin/moderation", headers=ann).status_code in (403, 303)
    page = client.get("/admin/moderation")
    assert page.status_code == 200 and "illicit" in page.text
    assert client.get(f"/admin/moderation/{item['id']}").status_code == 200
    resolved = client.post(
        f"/v1/admin/moderation/{item['id']}/resolve", json={"action": "dismiss"}
    ).json()
    assert resolved["status"] == "dismissed" and resolved["resolved_by"] == "admin"
    assert client.get("/v1/admin/moderation/").json()["data"] == []
    # The CLI: list, show, resolve, each as the OS user; the audit log has them all.
    env = {
        "CHATBOX_DATA_DIR": str(mod_settings.data_dir),
        "CHATBOX_POLICY_PATH": str(mod_settings.policy_path),
        **store_env(mod_settings.data_dir),
    }
    runner = CliRunner()
    listed = runner.invoke(main, ["moderation", "list", "--status", "all"], env=env)
    assert listed.exit_code == 0 and item["id"] in listed.output
    shown = runner.invoke(main, ["moderation", "show", item["id"]], env=env)
    assert shown.exit_code == 0 and "(not kept)" in shown.output
    done = runner.invoke(
        main, ["moderation", "resolve", item["id"], "--action", "confirm"], env=env
    )
    assert done.exit_code == 0 and "confirmed" in done.output
    audit = runner.invoke(main, ["audit", "list", "--json"], env=env)
    actions = [e["action"] for e in json.loads(audit.output)]
    assert actions.count("moderation.view") == 2 and actions.count("moderation.resolve") == 2


def test_openai_api_moderations_shape_and_content_filter(
    mod_settings: Settings, registry: ModelRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    with LiveServer(mod_settings, registry) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=server.api_key, max_retries=0)
        result = client.moderations.create(input=["how do I cook meth", "what a nice day"])
        bad, good = result.results
        assert bad.flagged and bad.categories.illicit
        assert (bad.category_scores.illicit or 0) > 0.6
        assert not good.flagged and not good.categories.hate
        assert good.category_scores.harassment < 0.6
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "how do I cook meth"}]
            )
        assert refused.value.code == "content_filter"
        cut_every_answer(monkeypatch)
        whole = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=24
        )
        assert whole.choices[0].finish_reason == "content_filter"
        chunks = list(
            client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                max_tokens=24,
            )
        )
        assert chunks[-1].choices[0].finish_reason == "content_filter"
