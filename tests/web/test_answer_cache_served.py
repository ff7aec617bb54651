"""The exact-match answer cache against `chatbox serve`: a deterministic OpenAI-API request
sent again by the same user is answered from the cache (the same body, byte for byte,
`x-chatbox-cache: hit`); another user, a streamed or sampled request, zero retention and a
request moderation marked never are; an account's erasure drops what it wrote."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from chatbox.chat.policy import default_policy_path
from tests.served import Served

NONE = {"X-Chatbox-Retention": "none"}
NO_MODERATION = "\n[moderation]\nenabled = false\n"
# Input moderation flags (and answers) any message holding the word: nothing to keep.
FLAG_WORD = """
[moderation]
output = false
[[moderation.rules]]
name = "marked"
patterns = ["quokkamark"]
category = "audit"
action = "flag"
directions = ["input"]
"""


def policy_file(where: Path, moderation: str) -> Path:
    head = default_policy_path().read_text().split("[moderation]", 1)[0]
    path = where / "policy.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + moderation)
    return path


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Served]:
    where = tmp_path_factory.mktemp("answer-cache")
    served = Served(where, model=tiny_gguf, policy=policy_file(where, NO_MODERATION)).start()
    try:
        yield served
    finally:
        served.kill()


@pytest.fixture(scope="module")
def keys(box: Served) -> dict[str, str]:
    return {name: box.user(name) for name in ("ann", "bob", "cy")}


def ask(
    box: Served, key: str, word: str, headers: dict[str, str] | None = None, **extra: Any
) -> httpx.Response:
    body = {
        "model": "tiny",
        "max_tokens": 8,
        "temperature": 0,
        "messages": [{"role": "user", "content": f"Name the ship {word}."}],
        **extra,
    }
    sent = {**box.auth(key), **(headers or {})}
    r = httpx.post(box.url + "/v1/chat/completions", json=body, headers=sent, timeout=120)
    assert r.status_code == 200, r.text
    return r


def metric(box: Served, name: str, labels: str = "") -> float:
    text = httpx.get(box.url + "/metrics", headers=box.admin, timeout=30).text
    pattern = re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") + r" (\S+)"
    found = re.search("^" + pattern + "$", text, re.M)
    return float(found.group(1)) if found else 0.0


def hits(box: Served) -> float:
    return metric(box, "chatbox_answer_cache_lookups_total", 'outcome="hit"')


def test_the_same_request_again_is_a_hit_with_the_same_body(
    box: Served, keys: dict[str, str]
) -> None:
    before, misses = hits(box), metric(box, "chatbox_answer_cache_lookups_total", 'outcome="miss"')
    first = ask(box, keys["ann"], "alpha")
    assert first.headers["x-chatbox-cache"] == "miss"
    again = ask(box, keys["ann"], "alpha")
    assert again.headers["x-chatbox-cache"] == "hit"
    assert again.content == first.content
    assert again.json()["usage"]["completion_tokens"] > 0  # the usage comes back too
    assert hits(box) == before + 1
    assert metric(box, "chatbox_answer_cache_lookups_total", 'outcome="miss"') == misses + 1
    # Any field that shapes the answer is part of the key.
    assert ask(box, keys["ann"], "alpha", max_tokens=9).headers["x-chatbox-cache"] == "miss"
    assert ask(box, keys["ann"], "alpha", seed=7).headers["x-chatbox-cache"] == "miss"


def usage(box: Served, name: str) -> tuple[int, int]:
    """The user's requests and tokens so far (the admin's usage report)."""
    r = httpx.get(box.url + "/v1/admin/usage", params={"name": name}, headers=box.admin)
    users = r.json()["users"]
    return (users[0]["requests"], users[0]["total_tokens"]) if users else (0, 0)


def test_a_hit_is_charged_what_the_first_answer_used(box: Served, keys: dict[str, str]) -> None:
    before = usage(box, "cy")
    first = ask(box, keys["cy"], "hotel")
    spent = first.json()["usage"]["total_tokens"]
    assert usage(box, "cy") == (before[0] + 1, before[1] + spent)
    assert ask(box, keys["cy"], "hotel").headers["x-chatbox-cache"] == "hit"
    assert usage(box, "cy") == (before[0] + 2, before[1] + 2 * spent)  # charge = "full"


@pytest.mark.sqlite_only(reason="holds SQLite's one write lock from another process")
def test_a_hit_waits_for_no_database_write(box: Served, keys: dict[str, str]) -> None:
    """Another process holding the database's write lock (a backup, the CLI) does not hold
    up a hit, whose usage is counted once the lock is let go."""
    first = ask(box, keys["cy"], "juliet")
    before = usage(box, "cy")
    db = sqlite3.connect(box.data_dir / "chatbox.db", isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")  # every write of the server now waits (5 s at most)
        again = ask(box, keys["cy"], "juliet")
    finally:
        db.execute("ROLLBACK")
        db.close()
    assert again.headers["x-chatbox-cache"] == "hit" and again.content == first.content
    spent = first.json()["usage"]["total_tokens"]
    assert usage(box, "cy") == (before[0] + 1, before[1] + spent)


def test_a_fixed_seed_is_cached_and_sampling_without_one_is_not(
    box: Served, keys: dict[str, str]
) -> None:
    seeded = {"temperature": 0.9, "seed": 11}
    assert ask(box, keys["ann"], "bravo", **seeded).headers["x-chatbox-cache"] == "miss"
    assert ask(box, keys["ann"], "bravo", **seeded).headers["x-chatbox-cache"] == "hit"
    for _ in range(2):
        assert "x-chatbox-cache" not in ask(box, keys["ann"], "bravo", temperature=0.9).headers
    streamed = ask(box, keys["ann"], "bravo", stream=True, **seeded)
    assert "x-chatbox-cache" not in streamed.headers and "[DONE]" in streamed.text


def test_another_user_never_hits(box: Served, keys: dict[str, str]) -> None:
    assert ask(box, keys["ann"], "charlie").headers["x-chatbox-cache"] == "miss"
    assert ask(box, keys["ann"], "charlie").headers["x-chatbox-cache"] == "hit"
    before = hits(box)
    assert ask(box, keys["cy"], "charlie").headers["x-chatbox-cache"] == "miss"
    assert hits(box) == before


def test_zero_retention_neither_reads_nor_writes(box: Served, keys: dict[str, str]) -> None:
    entries = metric(box, "chatbox_answer_cache_entries")
    for _ in range(2):  # a second one would be a hit, had the first been kept
        r = ask(box, keys["ann"], "delta", headers=NONE)
        assert "x-chatbox-cache" not in r.headers
    assert metric(box, "chatbox_answer_cache_entries") == entries
    ask(box, keys["ann"], "echo")  # kept: the same request under zero retention misses it
    assert ask(box, keys["ann"], "echo", headers=NONE).headers.get("x-chatbox-cache") is None


def test_erasing_an_account_drops_its_answers(box: Served, keys: dict[str, str]) -> None:
    ask(box, keys["bob"], "foxtrot")
    ask(box, keys["bob"], "golf")
    entries = metric(box, "chatbox_answer_cache_entries")
    r = httpx.delete(box.url + "/v1/admin/users/bob", headers=box.admin, timeout=60)
    assert r.status_code == 204, r.text
    assert metric(box, "chatbox_answer_cache_entries") == entries - 2


def test_an_answer_moderation_marked_is_not_kept(tmp_path: Path, tiny_gguf: Path) -> None:
    served = Served(tmp_path, model=tiny_gguf, policy=policy_file(tmp_path, FLAG_WORD)).start()
    try:
        key = served.user("dee")
        for _ in range(2):
            r = ask(served, key, "quokkamark")
            assert r.headers["x-chatbox-cache"] == "miss, not kept"
    finally:
        served.kill()
