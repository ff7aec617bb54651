"""Feedback on answers through the API of a served box (the tiny model): a rating is kept
with the answer's model, the newest counts and every change is exported; bad input is a
clear 4xx; only who sees the conversation may rate (404 otherwise); zero retention refuses
it; erasing the conversation or the rater's account leaves no comment in any file; /metrics
and the console count the thumbs per model."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.served import Served

TIMEOUT = 120.0


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Served]:
    served = Served(tmp_path_factory.mktemp("feedback"), model=tiny_gguf)
    with served:
        yield served


@pytest.fixture(scope="module")
def people(box: Served) -> dict[str, httpx.Client]:
    return {
        name: httpx.Client(base_url=box.url, headers=box.auth(box.user(name)), timeout=TIMEOUT)
        for name in ("ann", "bob", "cy")
    }


def _answered(http: httpx.Client, title: str = "a chat") -> tuple[str, str, str]:
    """A new conversation with one answer: (conversation, message, answer) ids."""
    conv = http.post("/v1/conversations", json={"title": title}).json()["id"]
    said = http.post(f"/v1/conversations/{conv}/turns", json={"content": "Hi", "max_tokens": 4})
    assert said.status_code == 200, said.text
    turns = http.get(f"/v1/conversations/{conv}").json()["turns"]
    assert [t["role"] for t in turns] == ["user", "assistant"], turns
    return conv, turns[0]["id"], turns[1]["id"]


def _rate(http: httpx.Client, conv: str, turn: str, **body: object) -> httpx.Response:
    return http.post(f"/v1/conversations/{conv}/turns/{turn}/feedback", json=body)


def _metric(box: Served, rating: str) -> float:
    text = httpx.get(box.url + "/metrics", headers=box.admin, timeout=TIMEOUT).text
    prefix = f'chatbox_feedback_ratings_total{{arm="",model="tiny",rating="{rating}"}} '
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    return float(lines[0].split()[-1]) if lines else 0.0


def test_a_rating_is_kept_with_its_model_and_the_newest_counts(
    box: Served, people: dict[str, httpx.Client]
) -> None:
    ann = people["ann"]
    conv, _, answer = _answered(ann)
    ups, downs = _metric(box, "up"), _metric(box, "down")

    r = _rate(ann, conv, answer, rating="up")
    assert r.status_code == 201, r.text
    assert r.json()["rating"] == "up" and r.json()["model"] == "tiny"
    r = _rate(ann, conv, answer, rating="down", comment="  it ignored the question  ")
    assert r.status_code == 201, r.text

    mine = ann.get(f"/v1/conversations/{conv}/turns/{answer}/feedback").json()
    assert (mine["rating"], mine["comment"]) == ("down", "it ignored the question")
    shown = ann.get(f"/v1/conversations/{conv}").json()["turns"]
    assert [t["my_rating"] for t in shown] == [None, "down"]
    # Every change is kept (and exported); the newest is the one that counts.
    export = ann.get("/v1/users/me/export")
    assert export.status_code == 200
    rated = json.loads(zipfile.ZipFile(io.BytesIO(export.content)).read("feedback.json"))
    assert [(f["turn_id"], f["rating"], f["comment"]) for f in rated] == [
        (answer, "up", None),
        (answer, "down", "it ignored the question"),
    ]
    assert (_metric(box, "up"), _metric(box, "down")) == (ups + 1, downs + 1)
    console = httpx.get(box.url + "/console/models", headers=box.admin, timeout=TIMEOUT)
    assert console.status_code == 200
    assert 'id="console-feedback"' in console.text and 'data-model="tiny"' in console.text


def test_bad_feedback_gets_a_4xx_naming_the_problem(
    box: Served, people: dict[str, httpx.Client]
) -> None:
    ann = people["ann"]
    conv, message, answer = _answered(ann)
    r = _rate(ann, conv, answer, rating="meh")
    assert r.status_code == 422 and "rating" in r.text, r.text
    r = _rate(ann, conv, answer, rating="up", comment="x" * 2001)
    assert r.status_code == 422 and "comment" in r.text, r.text
    r = _rate(ann, conv, message, rating="up")
    assert r.status_code == 422 and "only an answer" in r.text, r.text
    assert _rate(ann, conv, "t_missing", rating="up").status_code == 404
    assert ann.post(f"/v1/conversations/{conv}/turns/{answer}/feedback", json={}).status_code == 400
    temporary = ann.post("/v1/conversations", json={"temporary": True}).json()["id"]
    r = _rate(ann, temporary, "tmp_tmissing", rating="up")
    assert r.status_code == 422 and "temporary" in r.text, r.text


def test_only_who_sees_the_conversation_may_rate_it(
    box: Served, people: dict[str, httpx.Client]
) -> None:
    ann, bob, cy = people["ann"], people["bob"], people["cy"]
    conv, _, answer = _answered(ann)
    assert _rate(bob, conv, answer, rating="down", comment="nope").status_code == 404
    assert bob.get(f"/v1/conversations/{conv}/turns/{answer}/feedback").status_code == 404
    # In a workspace every member sees it, and each one's rating is their own.
    with httpx.Client(base_url=box.url, headers=box.admin, timeout=TIMEOUT) as admin:
        ws = admin.post("/v1/workspaces", json={"name": "raters"}).json()["id"]
        for name in ("ann", "bob"):
            added = admin.post(f"/v1/workspaces/{ws}/members", json={"name": name})
            assert added.status_code in (200, 201), added.text
    moved = ann.post(f"/v1/conversations/{conv}/workspace", json={"workspace_id": ws})
    assert moved.status_code == 200, moved.text
    assert _rate(bob, conv, answer, rating="down").status_code == 201
    assert _rate(ann, conv, answer, rating="up").status_code == 201
    assert bob.get(f"/v1/conversations/{conv}/turns/{answer}/feedback").json()["rating"] == "down"
    assert ann.get(f"/v1/conversations/{conv}/turns/{answer}/feedback").json()["rating"] == "up"
    assert _rate(cy, conv, answer, rating="up").status_code == 404  # not a member


def test_zero_retention_refuses_feedback(box: Served, people: dict[str, httpx.Client]) -> None:
    ann = people["ann"]
    conv, _, answer = _answered(ann)
    word = "ibisquorum3381"
    r = ann.post(
        f"/v1/conversations/{conv}/turns/{answer}/feedback",
        json={"rating": "down", "comment": f"the word {word}"},
        headers={"X-Chatbox-Retention": "none"},
    )
    assert r.status_code == 422 and "zero-data-retention" in r.text, r.text
    assert ann.get(f"/v1/conversations/{conv}/turns/{answer}/feedback").json()["rating"] is None
    assert box.holding(word) == []


def test_erasing_the_conversation_or_the_raters_account_erases_the_comment(
    box: Served, people: dict[str, httpx.Client]
) -> None:
    ann = people["ann"]
    gone, kept = "okapiverdant5520", "lemurcitadel7714"
    conv, _, answer = _answered(ann)
    assert _rate(ann, conv, answer, rating="down", comment=f"said {gone}").status_code == 201
    assert box.holding(gone), "the test needs the comment on disk first"
    assert ann.delete(f"/v1/conversations/{conv}").status_code == 204
    assert box.holding(gone) == []

    # A member's comment on a workspace conversation that stays goes with her account.
    dee = httpx.Client(base_url=box.url, headers=box.auth(box.user("dee")), timeout=TIMEOUT)
    conv, _, answer = _answered(ann, "the team's")
    with httpx.Client(base_url=box.url, headers=box.admin, timeout=TIMEOUT) as admin:
        ws = admin.post("/v1/workspaces", json={"name": "erasers"}).json()["id"]
        for name in ("ann", "dee"):
            assert admin.post(f"/v1/workspaces/{ws}/members", json={"name": name}).is_success
        assert ann.post(f"/v1/conversations/{conv}/workspace", json={"workspace_id": ws}).is_success
        assert _rate(dee, conv, answer, rating="up", comment=f"said {kept}").status_code == 201
        assert box.holding(kept)
        assert admin.delete("/v1/admin/users/dee").status_code == 204
    assert box.holding(kept) == []
    assert ann.get(f"/v1/conversations/{conv}").status_code == 200  # the conversation stays
    dee.close()
