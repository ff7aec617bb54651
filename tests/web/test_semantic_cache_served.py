"""The semantic answer cache against `chatbox serve`: a new chat's first question that means
what the same user asked first before is answered with that answer, labelled as cached (its
events, its stored turn, the page with "Answer fresh" beside it); `fresh` asks anew; a second
turn, another user, a near miss and zero retention never hit; zero retention keeps nothing;
erasing the conversation or the account drops what it wrote."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from chatbox.chat.policy import default_policy_path
from tests.conftest import run_sql
from tests.served import Served
from tests.sse import parse_sse

QUESTION = "What is the capital of France?"
PARAPHRASE = "What's France's capital city?"
NEAR_MISS = "What is the capital of Spain?"
NONE = {"X-Chatbox-Retention": "none"}
POLICY = """
[semantic_cache]
tiers = ["free"]

[moderation]
enabled = false
"""


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Served]:
    where = tmp_path_factory.mktemp("semantic-cache")
    head = default_policy_path().read_text().split("[semantic_cache]", 1)[0]
    # free conversations idle 30 days go (the CLI's retention run below)
    head = re.sub(r"(?m)^retention_days = 0\b", "retention_days = 30", head, count=1)
    assert "retention_days = 30" in head
    policy = where / "policy.toml"
    policy.write_text(head + POLICY)
    served = Served(where, model=tiny_gguf, policy=policy, env={"CHATBOX_MAX_TOKENS": "12"})
    served.start()
    try:
        yield served
    finally:
        served.kill()


@pytest.fixture(scope="module")
def keys(box: Served) -> dict[str, str]:
    return {name: box.user(name) for name in ("ann", "bob", "cy", "dee")}


def new_chat(box: Served, key: str, **body: Any) -> str:
    r = httpx.post(f"{box.url}/v1/conversations", headers=box.auth(key), json=body, timeout=60)
    assert r.status_code in (200, 201), r.text
    conv: str = r.json()["id"]
    return conv


def ask(
    box: Served,
    key: str,
    conv: str,
    text: str,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Send a message; the answer's `done` event."""
    with httpx.stream(
        "POST",
        f"{box.url}/v1/conversations/{conv}/turns",
        headers={**box.auth(key), **(headers or {})},
        json={"content": text, **extra},
        timeout=120,
    ) as r:
        assert r.status_code == 200, r.read()
        for event in parse_sse(r.iter_lines()):
            if event.event in ("done", "error"):
                done: dict[str, Any] = event.json()
                return {**done, "event": event.event}
    raise AssertionError("the stream ended without done")


def answer_text(box: Served, key: str, conv: str) -> str:
    r = httpx.get(f"{box.url}/v1/conversations/{conv}", headers=box.auth(key), timeout=60)
    turns = r.json()["turns"]
    return str(turns[-1]["content"])


def last_turn(box: Served, key: str, conv: str) -> dict[str, Any]:
    r = httpx.get(f"{box.url}/v1/conversations/{conv}", headers=box.auth(key), timeout=60)
    turn: dict[str, Any] = r.json()["turns"][-1]
    return turn


def metric(box: Served, name: str, labels: str = "") -> float:
    text = httpx.get(box.url + "/metrics", headers=box.admin, timeout=30).text
    pattern = re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") + r" (\S+)"
    found = re.search("^" + pattern + "$", text, re.M)
    return float(found.group(1)) if found else 0.0


def entries(box: Served) -> float:
    return metric(box, "chatbox_semantic_cache_entries")


def lookups(box: Served) -> float:
    hit = metric(box, "chatbox_semantic_cache_lookups_total", 'outcome="hit"')
    return hit + metric(box, "chatbox_semantic_cache_lookups_total", 'outcome="miss"')


@pytest.fixture(scope="module")
def first(box: Served, keys: dict[str, str]) -> str:
    """Ann's first chat, whose first question is kept."""
    conv = new_chat(box, keys["ann"])
    done = ask(box, keys["ann"], conv, QUESTION)
    assert done["event"] == "done" and done["status"] == "complete", done
    assert not done.get("cached")
    return conv


def test_a_paraphrased_first_question_gets_the_cached_answer_labelled(
    box: Served, keys: dict[str, str], first: str
) -> None:
    ann = keys["ann"]
    hits = metric(box, "chatbox_semantic_cache_lookups_total", 'outcome="hit"')
    conv = new_chat(box, ann)
    done = ask(box, ann, conv, PARAPHRASE)
    assert done["cached"] is True and done["route"] == "cached", done
    assert answer_text(box, ann, conv) == answer_text(box, ann, first)
    assert last_turn(box, ann, conv)["route"] == "cached"
    assert metric(box, "chatbox_semantic_cache_lookups_total", 'outcome="hit"') == hits + 1
    # The page labels it, with "Answer fresh" beside the label.
    page = httpx.get(f"{box.url}/c/{conv}", headers=box.auth(ann), timeout=60)
    assert page.status_code == 200, page.status_code
    assert 'data-testid="cached-label"' in page.text and "Answer fresh" in page.text
    plain = httpx.get(f"{box.url}/c/{first}", headers=box.auth(ann), timeout=60)
    assert 'data-testid="cached-label"' not in plain.text
    # `fresh` asks the model, however alike the question.
    again = ask(box, ann, new_chat(box, ann), PARAPHRASE, fresh=True)
    assert not again.get("cached") and again["route"] != "cached", again


def test_a_near_miss_does_not_hit(box: Served, keys: dict[str, str], first: str) -> None:
    done = ask(box, keys["ann"], new_chat(box, keys["ann"]), NEAR_MISS)
    assert not done.get("cached"), done


def test_a_second_turn_never_hits(box: Served, keys: dict[str, str], first: str) -> None:
    ann = keys["ann"]
    conv = new_chat(box, ann)
    ask(box, ann, conv, "Tell me something about rivers.")
    before = lookups(box)
    done = ask(box, ann, conv, QUESTION)
    assert not done.get("cached"), done
    assert lookups(box) == before  # not even looked up


def test_another_user_never_hits(box: Served, keys: dict[str, str], first: str) -> None:
    done = ask(box, keys["bob"], new_chat(box, keys["bob"]), QUESTION)
    assert not done.get("cached"), done


def test_zero_retention_neither_reads_nor_writes(
    box: Served, keys: dict[str, str], first: str
) -> None:
    ann = keys["ann"]
    kept, looked = entries(box), lookups(box)
    # Temporary chats: a kept question is not read, a new one (asked twice) not kept.
    for text in (QUESTION, "How do I boil an egg?", "How do I boil an egg?"):
        done = ask(box, ann, new_chat(box, ann, temporary=True), text)
        assert not done.get("cached"), done
    # Asked for by the request: a first question in a new stored chat is answered unsaved.
    done = ask(box, ann, new_chat(box, ann), PARAPHRASE, headers=NONE)
    assert done["temporary"] is True and not done.get("cached"), done
    assert entries(box) == kept and lookups(box) == looked


def test_erasing_the_conversation_or_the_account_drops_its_entries(
    box: Served, keys: dict[str, str]
) -> None:
    cy = keys["cy"]
    conv = new_chat(box, cy)
    ask(box, cy, conv, "How many legs does a spider have?")
    ask(box, cy, new_chat(box, cy), "Who painted the Mona Lisa?")
    kept = entries(box)
    r = httpx.delete(f"{box.url}/v1/conversations/{conv}", headers=box.auth(cy), timeout=60)
    assert r.status_code == 204, r.text
    assert entries(box) == kept - 1
    done = ask(box, cy, new_chat(box, cy), "How many legs do spiders have?")
    assert not done.get("cached"), done  # its answer went with the conversation
    kept = entries(box)
    r = httpx.delete(f"{box.url}/v1/admin/users/cy", headers=box.admin, timeout=60)
    assert r.status_code == 204, r.text
    assert entries(box) == kept - 2


def test_an_erasure_by_another_process_reaches_the_cache(box: Served, keys: dict[str, str]) -> None:
    """The CLI's retention run erases a conversation idle past its tier's retention; the
    running server no longer answers its first question from the semantic cache (nor keeps
    the erased answer), although it was not the process that erased it."""
    dee = keys["dee"]
    conv = new_chat(box, dee)
    ask(box, dee, conv, "Which planet is known as the red planet?")
    kept = entries(box)
    old = 1_000_000.0  # long past any retention
    run_sql(box.database, "UPDATE conversations SET updated_at = ? WHERE id = ?", (old, conv))
    out = box.cli("retention", "run")
    assert (
        conv not in httpx.get(f"{box.url}/v1/conversations", headers=box.auth(dee), timeout=60).text
    ), out
    done = ask(box, dee, new_chat(box, dee), "Which planet is called the red planet?")
    assert not done.get("cached"), done  # its answer went with the erased conversation
    assert entries(box) == kept  # dropped, and the new first question kept in its place
