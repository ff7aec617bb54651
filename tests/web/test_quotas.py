"""Quotas, routing and the overload order through the HTTP API (two users, two tiers)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx

from chatbox.catalog.registry import ModelRegistry
from tests.conftest import LiveServer, wait_ready
from tests.gateway import Box, gateway_box
from tests.sse import parse_sse

HX = {"HX-Request": "true"}
LIMIT_HEADERS = [
    f"x-ratelimit-{what}-{kind}"
    for what in ("limit", "remaining", "reset")
    for kind in ("requests", "tokens")
]


def usage(box: Box) -> dict[str, Any]:
    return dict(box.client.get("/v1/admin/usage", headers=box.h("admin")).json())


def test_requests_per_minute_gives_429_with_headers(tmp_path: Path, tiny_gguf: Path) -> None:
    with gateway_box(tmp_path, tiny_gguf, free_rpm=2) as box:
        first = box.complete("ann")
        assert first.status_code == 200
        assert all(h in first.headers for h in LIMIT_HEADERS)
        assert first.headers["x-ratelimit-limit-requests"] == "2"
        assert first.headers["x-ratelimit-remaining-requests"] == "1"
        assert box.complete("ann").status_code == 200
        refused = box.complete("ann")
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
        assert error["limit"] == "requests"
        assert 1 <= int(refused.headers["retry-after"]) <= 30
        assert all(h in refused.headers for h in LIMIT_HEADERS)
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        # The conversation API and the UI refuse too, before any engine work.
        conv = box.new_conversation("ann")
        r = box.client.post(
            f"/v1/conversations/{conv}/turns", json={"content": "hi"}, headers=box.h("ann")
        )
        assert r.status_code == 429 and "retry-after" in r.headers
        ui = box.client.post("/ui/new/send", data={"content": "hi"}, headers=box.h("ann", **HX))
        assert ui.status_code == 429
        assert "faster than your plan allows" in ui.text and "try again in" in ui.text
        assert (
            box.client.get(f"/v1/conversations/{conv}", headers=box.h("ann")).json()["turns"] == []
        )
        # Another user is not affected.
        assert box.complete("bob").status_code == 200


def test_tokens_per_minute_counts_prompt_plus_completion(tmp_path: Path, tiny_gguf: Path) -> None:
    with gateway_box(tmp_path, tiny_gguf, free_tpm=60) as box:
        first = box.complete("ann", "tell me about the sea " * 4)
        assert first.status_code == 200
        used = first.json()["usage"]["total_tokens"]
        assert used > 60  # more than the bucket: the rest is owed
        refused = box.complete("ann")
        assert refused.status_code == 429
        assert refused.json()["error"]["limit"] == "tokens"
        assert refused.headers["x-ratelimit-remaining-tokens"] == "0"
        assert refused.headers["x-ratelimit-limit-tokens"] == "60"
        rows = [r for r in usage(box)["data"] if r["user"] == "ann"]
        assert sum(r["total_tokens"] for r in rows) == used


def test_daily_budget_refuses_until_tomorrow(tmp_path: Path, tiny_gguf: Path) -> None:
    with gateway_box(tmp_path, tiny_gguf, free_daily=20) as box:
        assert box.complete("ann").status_code == 200
        refused = box.complete("ann")
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "insufficient_quota"
        assert refused.json()["error"]["limit"] == "budget"
        assert 1 <= int(refused.headers["retry-after"]) <= 86_401
        assert box.complete("bob").status_code == 200


def test_overload_sheds_free_first_with_503(tmp_path: Path, tiny_gguf: Path) -> None:
    with gateway_box(tmp_path, tiny_gguf) as box:
        box.saturate(2)  # at the high-water mark (2)
        shed = box.complete("ann")
        assert shed.status_code == 503
        assert shed.headers["retry-after"] == "7"
        assert shed.json()["error"]["type"] == "server_error"
        assert shed.json()["error"]["code"] == "overloaded"
        ui = box.client.post("/ui/new/send", data={"content": "hi"}, headers=box.h("ann", **HX))
        assert ui.status_code == 503 and "busy" in ui.text and "7 seconds" in ui.text
        paid = box.complete("bob")
        assert paid.status_code == 200 and paid.json()["model"] == "big"
        assert "x-chatbox-degraded-from" not in paid.headers
        users = {u["user"]: u for u in usage(box)["users"]}
        assert users["ann"]["shed"] == 2 and users["ann"]["requests"] == 0
        assert users["bob"]["shed"] == 0


def test_overload_then_degrades_paid_to_the_small_model(tmp_path: Path, tiny_gguf: Path) -> None:
    with gateway_box(tmp_path, tiny_gguf) as box:
        box.saturate({"big": 4, "tiny": 0})  # past high water x 2 on the paid tier's model
        r = box.complete("bob")
        assert r.status_code == 200
        assert r.json()["model"] == "tiny"
        assert r.headers["x-chatbox-degraded-from"] == "big"
        conv = box.new_conversation("bob")
        r = box.client.post(
            f"/v1/conversations/{conv}/turns", json={"content": "hi"}, headers=box.h("bob")
        )
        events = list(parse_sse(iter(r.text.split("\n"))))
        start, done = events[0].json(), events[-1].json()
        assert start["model"] == done["model"] == "tiny"
        assert done["degraded_from"] == "big" and "busy" in done["notice"]
        turn = box.client.get(f"/v1/conversations/{conv}", headers=box.h("bob")).json()
        answer = turn["turns"][-1]
        assert (answer["model"], answer["degraded_from"], answer["route"]) == (
            "tiny",
            "big",
            "degraded",
        )
        page = box.client.get(f"/c/{conv}", headers=box.h("bob")).text
        assert "instead of big" in page  # the stored answer still says so after a reload
        users = {u["user"]: u for u in usage(box)["users"]}
        assert users["bob"]["degraded"] == 2
        # Past that, when the small model is saturated too, paid requests queue.
        box.saturate(4)
        r = box.complete("bob")
        assert r.status_code == 200 and r.json()["model"] == "big"
        assert box.complete("ann").status_code == 503


def test_routing_by_tier_pick_pin_auto_and_canary(tmp_path: Path, tiny_gguf: Path) -> None:
    canary = '\n[[routing.canary]]\ntier = "team"\nmodel = "tiny"\npercent = 100\narm = "exp1"\n'
    with gateway_box(tmp_path, tiny_gguf, extra=canary) as box:
        assert box.complete("ann").json()["model"] == "tiny"  # free tier default
        r = box.complete("bob")
        assert r.json()["model"] == "big" and r.headers["x-chatbox-route"] == "tier"
        r = box.complete("bob", model="tiny")
        assert r.json()["model"] == "tiny" and r.headers["x-chatbox-route"] == "picked"
        r = box.complete("bob", model="auto")
        assert r.json()["model"] == "tiny" and r.headers["x-chatbox-route"] == "auto-small"
        code = "Fix this:\n```python\ndef f(x):\n    return x +\n```"
        r = box.complete("bob", code, model="auto")
        assert r.json()["model"] == "big" and r.headers["x-chatbox-route"] == "auto-large"
        assert box.complete("bob", model="nope").status_code == 404
        # carol (team tier, pinned in the policy) always gets her pinned model
        r = box.complete("carol", model="big")
        assert r.json()["model"] == "tiny" and r.headers["x-chatbox-route"] == "pin"
        assert "auto" in [
            m["id"] for m in box.client.get("/v1/models", headers=box.h("ann")).json()["data"]
        ]


def test_canary_sends_a_share_of_a_tier_and_tags_usage(tmp_path: Path, tiny_gguf: Path) -> None:
    canary = '\n[[routing.canary]]\ntier = "paid"\nmodel = "tiny"\npercent = 100\narm = "exp1"\n'
    with gateway_box(tmp_path, tiny_gguf, extra=canary) as box:
        r = box.complete("bob")
        assert r.json()["model"] == "tiny" and r.headers["x-chatbox-arm"] == "exp1"
        assert box.complete("ann").json()["model"] == "tiny"
        rows = usage(box)["data"]
        assert [(x["user"], x["arm"]) for x in rows if x["user"] == "bob"] == [("bob", "exp1")]
        assert [x["arm"] for x in rows if x["user"] == "ann"] == [""]
        conv = box.new_conversation("bob")
        box.client.post(
            f"/v1/conversations/{conv}/turns", json={"content": "hi"}, headers=box.h("bob")
        )
        answer = box.client.get(f"/v1/conversations/{conv}", headers=box.h("bob")).json()
        assert (answer["turns"][-1]["arm"], answer["turns"][-1]["route"]) == ("exp1", "canary")


def test_fair_share_bounds_one_users_concurrent_answers(tmp_path: Path, tiny_gguf: Path) -> None:
    with gateway_box(tmp_path, tiny_gguf) as box:
        settings = box.client.app.state.services.settings
    registry = ModelRegistry(settings.models_path)
    with LiveServer(settings, registry) as live:
        wait_ready(lambda: httpx.get(live.url + "/readyz").status_code)
        app = live.server.config.app
        engine = app.state.services.models.pool._engines["tiny"]
        gate = threading.Event()
        engine._scheduler.call(lambda: gate.wait(30))  # hold the decode thread
        keys = box.keys
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}

        def post(name: str) -> httpx.Response:
            return httpx.post(
                f"{live.url}/v1/chat/completions",
                json=body,
                timeout=30,
                headers={"Authorization": f"Bearer {keys[name]}"},
            )

        with httpx.Client(timeout=30) as http:
            auth = {"Authorization": f"Bearer {keys['ann']}"}
            with http.stream(
                "POST", f"{live.url}/v1/chat/completions", json=body, headers=auth
            ) as first:
                assert first.status_code == 200
                second = post("ann")  # free tier: one answer at a time
                assert second.status_code == 429
                assert second.json()["error"]["limit"] == "streams"
                assert "retry-after" in second.headers
                gate.set()
                assert post("bob").status_code == 200  # others still get in
                text = first.read().decode()
            assert "[DONE]" in text
        assert post("ann").status_code == 200  # the slot is given back when it ends


def test_queued_requests_see_their_position(tmp_path: Path, tiny_gguf: Path) -> None:
    with gateway_box(tmp_path, tiny_gguf) as box:
        box.saturate(6)  # well past every mark: the team tier ("queue") waits in line
        conv = box.new_conversation("carol")
        r = box.client.post(
            f"/v1/conversations/{conv}/turns", json={"content": "hi"}, headers=box.h("carol")
        )
        assert r.status_code == 200
        events = list(parse_sse(iter(r.text.split("\n"))))
        kinds = [e.event for e in events]
        assert kinds[:2] == ["start", "queued"] and kinds[-1] == "done"
        assert events[1].json() == {"position": 6}


async def test_the_streaming_bubble_shows_the_queue_position() -> None:
    from chatbox.chat import TurnRun
    from chatbox.web.ui.helpers import ui_events

    run = TurnRun("c_1", "t_2", "t_1", "tiny", "t_1", grace_s=1.0)
    run.publish("start", {"turn_id": "t_2"})
    run.publish("queued", {"position": 3})
    frames = ui_events(None, None, None, None, run, 0)  # type: ignore[arg-type]
    first = await anext(frames)
    await frames.aclose()
    assert b"event: html" in first and b"you are number 3 in line" in first
