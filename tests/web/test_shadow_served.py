"""Shadow traffic and pre-warming on a served box with two tiny models.

Shadow: `chatbox shadow start` mirrors a tier's answers to the second model once each answer
is done; the comparison shows on the console page, in the admin API and in /metrics; the user
sees only the served answer; zero-retention requests are never mirrored; starting and
stopping are audit-logged and bad input is a clear 4xx.

Pre-warm: with two weeks of hourly history in which the second model is busy in the coming
hour, the started server loads it at once, and the console shows its profile, the forecast
beside the requests actually counted, and the decision."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from chatbox.chat.rollout.prewarm import hour_of_week
from tests.conftest import run_sql
from tests.served import Served
from tests.tinymodel import make_tiny_gguf

TIMEOUT = 120.0


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Served]:
    where = tmp_path_factory.mktemp("shadow")
    candidate = make_tiny_gguf(where / "candidate.gguf", seed=4321)
    served = Served(where, model=tiny_gguf)
    served.cli("models", "add", str(candidate), "--name", "cand", "--link")
    seed_history(served.database)
    with served:
        yield served


def seed_history(db: Path | str) -> None:
    """Two weeks of requests per hour: `tiny` a few every hour, `cand` many in the hour
    after the current one (in each of those weeks) and none otherwise."""
    now = int(time.time() // 3600)
    busy = hour_of_week(now + 1)
    rows = []
    for hour in range(now - 14 * 24, now):
        rows.append(("tiny", hour, 2, 200))
        if hour_of_week(hour) == busy:
            rows.append(("cand", hour, 30, 3000))
    run_sql(
        db, "INSERT INTO usage_hours (model, hour, requests, tokens) VALUES (?, ?, ?, ?)", *rows
    )


def shadow_cli(box: Served, *args: str) -> str:
    return box.cli("shadow", "--front", box.url, "--key", box.admin_key, *args)


def status(box: Served) -> dict[str, Any]:
    r = httpx.get(box.url + "/v1/admin/shadow", headers=box.admin, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def outcome(box: Served, name: str) -> int:
    found = [o["count"] for o in status(box)["outcomes"] if o["outcome"] == name]
    return sum(found)


def wait_for(box: Served, name: str, at_least: int, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while outcome(box, name) < at_least:
        assert time.monotonic() < deadline, status(box)
        time.sleep(0.2)


def metric(box: Served, line_start: str) -> float:
    text = httpx.get(box.url + "/metrics", headers=box.admin, timeout=TIMEOUT).text
    lines = [line for line in text.splitlines() if line.startswith(line_start)]
    return float(lines[0].split()[-1]) if lines else 0.0


def test_answers_are_mirrored_after_they_are_done_and_compared(box: Served) -> None:
    out = shadow_cli(box, "start", "cand", "--tier", "free", "--percent", "100")
    assert "free: 100% mirrored to cand" in out
    ann = httpx.Client(base_url=box.url, headers=box.auth(box.user("ann")), timeout=TIMEOUT)
    conv = ann.post("/v1/conversations", json={"title": "mirrored"}).json()["id"]
    said = ann.post(f"/v1/conversations/{conv}/turns", json={"content": "Hi", "max_tokens": 8})
    assert said.status_code == 200, said.text
    wait_for(box, "compared", 1)

    turns = ann.get(f"/v1/conversations/{conv}").json()["turns"]
    answer = turns[-1]
    row = status(box)["recent"][0]
    assert (row["tier"], row["served_model"], row["candidate"]) == ("free", "tiny", "cand")
    # The shadow request was sent only once the served answer was stored.
    assert row["started_at"] >= answer["created_at"]
    assert row["shadow_tokens"] > 0 and row["served_tokens"] == answer["usage"]["completion_tokens"]
    assert row["shadow_ttft_s"] is not None and row["similarity"] is not None
    assert -1.0 <= row["similarity"] <= 1.0

    # The user sees the served answer only: no turn, model or text of the candidate.
    assert [(t["role"], t["model"]) for t in turns] == [("user", None), ("assistant", "tiny")]
    assert "cand" not in json.dumps(ann.get(f"/v1/conversations/{conv}").json())
    assert "cand" not in ann.get("/v1/users/me/export").text

    # The console's page and /metrics show the comparison.
    page = httpx.get(box.url + "/console/shadow", headers=box.admin, timeout=TIMEOUT)
    assert page.status_code == 200
    assert 'data-tier="free" data-candidate="cand"' in page.text
    labels = '{candidate="cand",outcome="compared",tier="free"}'
    assert metric(box, "chatbox_shadow_requests_total" + labels) >= 1
    assert metric(box, 'chatbox_shadow_similarity_count{candidate="cand",tier="free"}') >= 1
    ttft = 'chatbox_shadow_ttft_seconds_count{candidate="cand",role="shadow",tier="free"}'
    assert metric(box, ttft) >= 1
    # Shadow requests are in none of the engine's figures that alerts and the console read:
    # the candidate, asked only by shadow traffic, has no time to first token and no request.
    assert metric(box, 'chatbox_engine_time_to_first_token_seconds_count{model="tiny"}') >= 1
    assert metric(box, 'chatbox_engine_time_to_first_token_seconds_count{model="cand"}') == 0
    assert metric(box, 'chatbox_engine_requests_total{finish_reason="stop",model="cand"}') == 0
    assert metric(box, 'chatbox_engine_requests_total{finish_reason="length",model="cand"}') == 0

    # The OpenAI-compatible API's answers are mirrored too.
    done = outcome(box, "compared")
    r = ann.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8},
    )
    assert r.status_code == 200, r.text
    assert "cand" not in r.text
    wait_for(box, "compared", done + 1)


def test_zero_retention_requests_are_never_mirrored(box: Served) -> None:
    if not status(box)["rules"]:
        shadow_cli(box, "start", "cand", "--tier", "free", "--percent", "100")
    bob = httpx.Client(base_url=box.url, headers=box.auth(box.user("bob")), timeout=TIMEOUT)
    compared = outcome(box, "compared")
    body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}
    # Asked by the request's header, then by the account's switch.
    r = bob.post("/v1/chat/completions", json=body, headers={"X-Chatbox-Retention": "none"})
    assert r.status_code == 200, r.text
    wait_for(box, "skipped_zdr", 1)
    box.cli("users", "set-retention", "bob", "none")
    r = bob.post("/v1/chat/completions", json={**body, "stream": True})
    assert r.status_code == 200, r.text
    wait_for(box, "skipped_zdr", 2)
    time.sleep(1.0)  # a mirrored answer would have been compared by now
    assert outcome(box, "compared") == compared
    labels = '{candidate="cand",outcome="skipped_zdr",tier="free"}'
    assert metric(box, "chatbox_shadow_requests_total" + labels) == 2


def test_start_and_stop_are_audited_and_bad_input_is_a_4xx(box: Served) -> None:
    api = httpx.Client(base_url=box.url, headers=box.admin, timeout=TIMEOUT)
    for body, named in (
        ({"candidate": "nope", "tier": "free", "percent": 10}, "nope"),
        ({"candidate": "cand", "tier": "gold", "percent": 10}, "gold"),
        ({"candidate": "cand", "tier": "free", "percent": 0}, "percent"),
    ):
        r = api.post("/v1/admin/shadow/start", json=body)
        assert r.status_code in (400, 422) and named in r.text, r.text
    cy = httpx.Client(base_url=box.url, headers=box.auth(box.user("cy")), timeout=TIMEOUT)
    assert cy.post("/v1/admin/shadow/stop", json={"tier": "free"}).status_code == 403

    shadow_cli(box, "start", "cand", "--tier", "paid", "--percent", "5")
    out = shadow_cli(box, "stop", "--tier", "paid")
    assert "paid:" not in out
    assert api.post("/v1/admin/shadow/stop", json={"tier": "paid"}).status_code == 404
    logged = json.loads(box.cli("audit", "list", "--json"))
    actions = [(e["action"], e["detail"].get("tier")) for e in logged]
    assert ("shadow.start", "paid") in actions and ("shadow.stop", "paid") in actions


def test_the_pre_warmer_loads_ahead_of_the_peak_and_the_console_shows_why(box: Served) -> None:
    dee = httpx.Client(base_url=box.url, headers=box.auth(box.user("dee")), timeout=TIMEOUT)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    assert dee.post("/v1/chat/completions", json=body).status_code == 200

    r = httpx.get(box.url + "/v1/admin/prewarm", headers=box.admin, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    view = r.json()
    loads = [d for d in view["decisions"] if d["action"] == "load"]
    assert [d["model"] for d in loads] == ["cand"], view["decisions"]
    assert "busy hour" in loads[0]["reason"]
    models = {m["model"]: m for m in view["models"]}
    assert models["cand"]["loaded"] and models["cand"]["peak"] == 30
    assert len(models["cand"]["profile"]) == 168
    now = next(h for h in models["tiny"]["hours"] if h["now"])
    assert now["forecast"] == 2 and now["actual"] >= 1  # the request just made counts

    page = httpx.get(box.url + "/console/prewarm", headers=box.admin, timeout=TIMEOUT)
    assert page.status_code == 200
    assert 'class="usage-table console-table prewarm-profile" data-model="cand"' in page.text
    assert "busy hour" in page.text and "Peak 30.0 requests/h" in page.text
    member = httpx.get(box.url + "/console/prewarm", headers=dee.headers, timeout=TIMEOUT)
    assert member.status_code == 403
