"""Moderation in temporary chats (checked like a stored chat, nothing of it kept, not even in
the review queue's text) and the marks a warned, flagged or filtered turn shows in the
conversation view."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

import chatbox.chat.privacy.temporary as temporary
from chatbox.app import create_app
from chatbox.catalog.registry import ModelRegistry
from chatbox.chat.policy import default_policy_path
from chatbox.moderation import Moderator, Verdict
from chatbox.settings import Settings
from tests.conftest import bearer, seed_user, store_holding, test_settings
from tests.sse import Event, parse_sse

EXTRA = """
[moderation]
window_tokens = 8
stride_tokens = 4
[[moderation.rules]]
name = "watchlist"
terms = ["quokka"]
category = "wildlife"
action = "flag"
directions = ["input"]
[[moderation.rules]]
name = "noted"
terms = ["wombat"]
category = "marsupials"
action = "warn"
directions = ["input"]
"""
HX = {"HX-Request": "true"}
SECRET = "zebrafjord7"


@pytest.fixture
def box(data_dir: Path, registry: ModelRegistry) -> Iterator[tuple[TestClient, dict[str, str]]]:
    """(client as the admin, a member's headers)."""
    policy = data_dir.parent / "policy.toml"
    policy.parent.mkdir(parents=True, exist_ok=True)
    text = default_policy_path().read_text()
    policy.write_text(text[: text.index("[moderation]")] + EXTRA)
    settings: Settings = test_settings(
        data_dir, policy_path=policy, max_tokens=24, check_answers=True
    )
    admin = seed_user(settings)
    member = seed_user(settings, "ann", role="member", tier="free")
    with TestClient(create_app(settings, registry), timeout=60) as c:
        c.headers.update(bearer(admin))
        yield c, bearer(member)


def sse(text: str) -> list[Event]:
    return list(parse_sse(iter(text.split("\n"))))


def answer_with(monkeypatch: pytest.MonkeyPatch, verdict: Verdict) -> None:
    """Every answer window gets `verdict` (messages are checked for real)."""
    real = Moderator.check

    async def check(
        self: Moderator, text: str, tier: str, direction: str, *args: Any, **kwargs: Any
    ) -> Verdict:
        if direction == "output":
            return verdict
        return await real(self, text, tier, direction, *args, **kwargs)

    monkeypatch.setattr(Moderator, "check", check)


CUT = Verdict("block", "violence", {"violence": 0.99}, {"violence": "block"})
FLAG = Verdict("flag", "harassment", {"harassment": 0.8}, {"harassment": "flag"})


def stream_of(client: TestClient, body: str, headers: dict[str, str]) -> list[Event]:
    """The SSE behind the streaming bubble an htmx response holds, to its end."""
    url = re.search(r'sse-connect="([^"]+)"', body)
    assert url, body
    return sse(client.get(url.group(1), headers=headers).text)


def row_counts(client: TestClient) -> dict[str, int]:
    db = client.app.state.services.store.db
    names = client.blocking_portal.call(db.tables)
    return {
        name: client.blocking_portal.call(db.fetchone, f'SELECT count(*) FROM "{name}"')[0]
        for name in names
    }


def queue(client: TestClient) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = client.get("/v1/admin/moderation/?status=all").json()["data"]
    return items


# -- temporary chats -----------------------------------------------------------------------


def test_a_temporary_chat_checks_the_message_before_any_model_work(
    box: tuple[TestClient, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, ann = box
    submitted: list[object] = []
    real_submit = temporary.submit
    monkeypatch.setattr(
        temporary, "submit", lambda *a, **k: submitted.append(a) or real_submit(*a, **k)
    )
    tmp = client.post("/v1/conversations", json={"temporary": True}, headers=ann).json()["id"]
    refused = client.post(
        f"/v1/conversations/{tmp}/turns",
        json={"content": "how do I cook meth in my garage"},
        headers=ann,
    )
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["type"] == "content_filter" and error["category"] == "illicit"
    assert "wasn't sent" in error["message"]
    support = client.post(
        f"/v1/conversations/{tmp}/turns",
        json={"content": "I want to kill myself tonight"},
        headers=ann,
    )
    assert support.status_code == 400
    assert "988" in support.json()["error"]["message"]  # resources, not a bare refusal
    assert submitted == []  # the model never saw either
    assert client.get(f"/v1/conversations/{tmp}", headers=ann).json()["messages"] == []
    # In the browser the refusal is the alert, and the chat stays empty.
    ui = client.post(
        "/ui/temporary/send", data={"content": "how do I cook meth"}, headers={**ann, **HX}
    )
    assert ui.status_code == 400 and "Nothing was saved" in ui.text
    assert ui.headers["HX-Retarget"] == "#alerts"
    ok = client.post(f"/v1/conversations/{tmp}/turns", json={"content": "hello"}, headers=ann)
    assert sse(ok.text)[-1].event == "done" and len(submitted) == 1
    # The queue knows it happened: categories and scores, never the text.
    items = queue(client)
    assert {i["category"] for i in items} == {"illicit", "self-harm"}
    assert all(i["source"] == "temporary chat" and not i["has_text"] for i in items)
    assert client.get(f"/v1/admin/moderation/{items[0]['id']}").json()["text"] is None


def test_a_flagged_message_in_a_temporary_chat_is_answered_and_marked(
    box: tuple[TestClient, dict[str, str]],
) -> None:
    client, ann = box
    r = client.post(
        "/ui/temporary/send",
        data={"content": f"tell me about the quokka {SECRET}"},
        headers={**ann, **HX},
    )
    assert r.status_code == 200, r.text
    assert "flagged for review: wildlife" in r.text  # on the message's bubble at once
    assert stream_of(client, r.text, ann)[-1].event == "done"  # answered
    page = client.get(r.headers["HX-Push-Url"], headers=ann).text
    assert "flagged for review: wildlife" in page
    (item,) = queue(client)
    assert item["direction"] == "input" and item["action"] == "flag"
    assert item["source"] == "temporary chat (rule watchlist)" and not item["has_text"]
    client.blocking_portal.call(client.app.state.services.store.db.checkpoint)
    assert store_holding(client, SECRET) == []


def test_a_temporary_answer_crossing_the_line_is_cut_and_nothing_of_it_kept(
    box: tuple[TestClient, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, ann = box
    answer_with(monkeypatch, CUT)
    before = row_counts(client)
    tmp = client.post("/v1/conversations", json={"temporary": True}, headers=ann).json()["id"]
    r = client.post(
        f"/v1/conversations/{tmp}/turns",
        json={"content": f"tell me a story {SECRET}"},
        headers=ann,
    )
    got = sse(r.text)
    kinds = [e.event for e in got]
    assert "moderation" in kinds
    mod = got[kinds.index("moderation")].json()
    assert mod["action"] == "block" and mod["category"] == "violence"
    assert mod["direction"] == "output" and "This answer was stopped" in mod["message"]
    assert kinds.index("moderation") > kinds.index("token")
    assert "token" not in kinds[kinds.index("moderation") :]  # cut: nothing after the block
    assert kinds.count("token") < 24
    done = got[-1].json()
    assert got[-1].event == "done"
    assert done["status"] == "filtered" and done["finish_reason"] == "content_filter"
    # The chat (in RAM) holds the notice, not what was cut.
    messages = client.get(f"/v1/conversations/{tmp}", headers=ann).json()["messages"]
    assert messages[-1] == {"role": "assistant", "content": mod["message"]}
    (item,) = queue(client)
    assert item["direction"] == "output" and item["category"] == "violence"
    assert not item["has_text"] and item["turn_id"] is None
    after = row_counts(client)
    assert {t for t in before if before[t] != after[t]} <= {
        "usage",
        "usage_hours",
        "limit_buckets",  # the rate limits' counters, on PostgreSQL
        "moderation_items",
    }
    client.blocking_portal.call(client.app.state.services.store.db.checkpoint)
    assert store_holding(client, SECRET) == []


def test_the_temporary_streaming_bubble_shows_the_notice_in_place_of_the_answer(
    box: tuple[TestClient, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, ann = box
    answer_with(monkeypatch, CUT)
    r = client.post("/ui/temporary/send", data={"content": "tell me a story"}, headers=ann)
    ui = stream_of(client, r.text, ann)
    notes = [e.data for e in ui if e.event == "html" and "moderation-note" in e.data]
    assert notes and "This answer was stopped" in notes[-1]
    assert ui[-1].event == "done" and 'data-status="filtered"' in ui[-1].data
    assert "filtered: violence" in ui[-1].data and "moderation-note" in ui[-1].data
    page = client.get(r.headers["HX-Push-Url"], headers=ann).text
    assert "filtered: violence" in page and 'class="moderation-note"' in page


# -- marks in the conversation view ----------------------------------------------------------


def _say(client: TestClient, conv: str, text: str, headers: dict[str, str]) -> str:
    """Send through the UI; the bubbles it returned (after the answer has finished)."""
    r = client.post(f"/ui/c/{conv}/send", data={"content": text}, headers={**headers, **HX})
    assert r.status_code == 200, r.text
    assert stream_of(client, r.text, headers)[-1].event == "done"
    return r.text


def _turn_html(page: str, turn_id: str) -> str:
    start = page.index(f'id="turn-{turn_id}"')
    return page[start : page.index("</article>", start)]


def test_warned_and_flagged_messages_are_marked_on_their_bubbles(
    box: tuple[TestClient, dict[str, str]],
) -> None:
    client, ann = box
    conv = client.post("/v1/conversations", json={}, headers=ann).json()["id"]
    flagged = _say(client, conv, "tell me about the quokka", ann)
    assert "flagged for review: wildlife" in flagged  # on the bubble at once
    assert "warning: marsupials" in _say(client, conv, "and the wombat?", ann)
    plain = _say(client, conv, "and the koala?", ann)
    assert "badge-moderation" not in plain
    turns = client.get(f"/v1/conversations/{conv}", headers=ann).json()["turns"]
    users = [t for t in turns if t["role"] == "user"]
    page = client.get(f"/c/{conv}", headers=ann).text
    assert "flagged for review: wildlife" in _turn_html(page, users[0]["id"])
    assert "warning: marsupials" in _turn_html(page, users[1]["id"])
    assert "badge-moderation" not in _turn_html(page, users[2]["id"])
    # An admin's review changes the mark: dismissed (a false alarm) shows none.
    items = {i["category"]: i["id"] for i in queue(client)}
    client.post(f"/v1/admin/moderation/{items['wildlife']}/resolve", json={"action": "dismiss"})
    page = client.get(f"/c/{conv}", headers=ann).text
    assert "wildlife" not in page and "warning: marsupials" in page


def test_a_flagged_answer_is_marked_and_a_filtered_one_shows_its_notice(
    box: tuple[TestClient, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, ann = box
    conv = client.post("/v1/conversations", json={}, headers=ann).json()["id"]
    answer_with(monkeypatch, FLAG)
    r = client.post(f"/ui/c/{conv}/send", data={"content": "hello"}, headers={**ann, **HX})
    done = stream_of(client, r.text, ann)[-1]
    assert done.event == "done" and "flagged for review: harassment" in done.data
    answer_with(monkeypatch, CUT)
    _say(client, conv, "tell me a story", ann)
    turns = client.get(f"/v1/conversations/{conv}", headers=ann).json()["turns"]
    flagged, filtered = (t for t in turns if t["role"] == "assistant")
    assert filtered["status"] == "filtered"
    page = client.get(f"/c/{conv}", headers=ann).text
    assert "flagged for review: harassment" in _turn_html(page, flagged["id"])
    bubble = _turn_html(page, filtered["id"])
    assert "filtered: violence" in bubble
    assert 'class="moderation-note"' in bubble and "This answer was stopped" in bubble
    assert 'class="md"' not in bubble  # the notice stands in place of the text
