"""The browser side: the "Your data" page, temporary chats (stored nowhere), import, the
zero-data-retention switch and deleting one's account after typing its name."""

from __future__ import annotations

import json
import re

from tests.data.conftest import App
from tests.data.test_zero_retention import row_counts
from tests.sse import parse_sse

HX = {"HX-Request": "true"}


def _stream(app: App, body: str, headers: dict[str, str]) -> list[str]:
    url = re.search(r'sse-connect="([^"]+)"', body)
    assert url, body
    r = app.client.get(url.group(1), headers=headers)
    return [e.event for e in parse_sse(iter(r.text.split("\n")))]


def test_the_data_page_says_what_is_kept_and_offers_every_action(app: App) -> None:
    page = app.client.get("/settings/data", headers=app.bob)
    assert page.status_code == 200
    text = page.text
    assert "Conversations are kept until you delete them." in text
    for url in ("/v1/users/me/export", "/ui/settings/import", "/ui/settings/delete", "/temporary"):
        assert url in text, url
    assert 'href="/settings/data"' in app.client.get("/", headers=app.bob).text  # in the nav


def test_a_temporary_chat_in_the_browser_stores_nothing(app: App) -> None:
    c = app.client
    before = row_counts(app)
    r = c.post(
        "/ui/temporary/send", data={"content": "hello, off the record"}, headers={**app.bob, **HX}
    )
    assert r.status_code == 200, r.text
    url = r.headers["HX-Push-Url"]
    assert url.startswith("/temporary/tmp_") and 'hx-swap-oob="true"' in r.text
    assert _stream(app, r.text, app.bob)[-1] == "done"
    chat_id = url.rsplit("/", 1)[1]
    r = c.post(
        f"/ui/temporary/{chat_id}/send", data={"content": "and again"}, headers={**app.bob, **HX}
    )
    assert _stream(app, r.text, app.bob)[-1] == "done"
    page = c.get(url, headers=app.bob).text
    assert "hello, off the record" in page and "and again" in page
    assert c.get(url, headers=app.admin).status_code == 404  # bob's alone
    after = row_counts(app)
    # Usage is counted (and on PostgreSQL the rate limits' counters). Output moderation may
    # queue the tiny model's random answer for review: a temporary chat's item keeps scores,
    # never text, and points at no chat.
    assert {t for t in before if before[t] != after[t]} <= {
        "usage",
        "usage_hours",
        "limit_buckets",
        "moderation_items",
    }
    new_items = after["moderation_items"] - before["moderation_items"]
    rows = app.call(
        app.services.store.db.fetchall,
        "SELECT text, conversation_id FROM moderation_items ORDER BY created_at DESC"
        f" LIMIT {new_items}",
    )
    assert rows == [(None, None)] * new_items


def test_import_switch_and_delete_through_the_ui(app: App) -> None:
    c = app.client
    export = [
        {
            "title": "Imported chat",
            "mapping": {
                "r": {"id": "r", "message": None, "parent": None, "children": ["u"]},
                "u": {
                    "id": "u",
                    "message": {
                        "author": {"role": "user"},
                        "content": {
                            "content_type": "multimodal_text",
                            "parts": [
                                {"content_type": "image_asset_pointer", "asset_pointer": "x"},
                                {"content_type": "image_asset_pointer", "asset_pointer": "y"},
                                "hi from elsewhere",
                            ],
                        },
                    },
                    "parent": "r",
                    "children": [],
                },
            },
        }
    ]
    r = c.post(
        "/ui/settings/import",
        files={"file": ("conversations.json", json.dumps(export).encode())},
        headers={**app.bob, **HX},
    )
    assert r.status_code == 200 and "Imported 1 conversation (1 message)." in r.text
    assert "Left out" in r.text and "2 images" in r.text and "imports the text only" in r.text
    bad = c.post(
        "/ui/settings/import", files={"file": ("c.json", b"[1, 2]")}, headers={**app.bob, **HX}
    )
    assert bad.status_code == 422 and "Import refused" in bad.text
    assert [x["title"] for x in c.get("/v1/conversations", headers=app.bob).json()["data"]] == [
        "Imported chat"
    ]

    r = c.post("/ui/settings/retention", data={"zero_retention": "on"}, headers={**app.bob, **HX})
    assert "nothing you write is stored" in r.text
    refused = c.post("/ui/new/send", data={"content": "keep this?"}, headers={**app.bob, **HX})
    assert refused.status_code == 422 and "temporary chat" in refused.text

    wrong = c.post("/ui/settings/delete", data={"confirm": "admin"}, headers={**app.bob, **HX})
    assert wrong.status_code == 422 and "account name" in wrong.text
    done = c.post("/ui/settings/delete", data={"confirm": "bob"}, headers={**app.bob, **HX})
    assert done.status_code == 200 and done.headers["HX-Redirect"] == "/login"
    assert c.get("/v1/conversations", headers=app.bob).status_code == 401
