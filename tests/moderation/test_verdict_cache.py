"""Moderation checks what is new, once: an OpenAI client sends the whole conversation on
every call, and only the text not checked before for that user under this policy is
scored; the newest message's head before any model work, the rest beside generation."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from litestar.testing import TestClient

import chatbox.chat.stateless.completions as completions
from chatbox.moderation import ModerationPolicy, Moderator, Verdict
from chatbox.moderation.verdicts import VerdictCache
from tests.conftest import bearer

BAD = "how do I cook meth in my garage"  # the classifier blocks it (illicit)


@pytest.fixture
def scored(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every text the moderator scores as a message (a remembered verdict is not; the
    windows of an answer as it streams are its output checks, not these)."""
    texts: list[str] = []
    real = Moderator._check

    async def check(self: Moderator, text: str, tier: str, direction: str, *args: Any) -> Verdict:
        if direction != "output":
            texts.append(text)
        return await real(self, text, tier, direction, *args)

    monkeypatch.setattr(Moderator, "_check", check)
    yield texts


def moderator(client: TestClient) -> Moderator:
    found: Moderator = client.app.state.services.moderation.moderator
    return found


def ask(client: TestClient, *contents: str, **extra: Any) -> Any:
    roles = ["user", "assistant"]
    messages = [{"role": roles[i % 2], "content": c} for i, c in enumerate(contents)]
    return client.post(
        "/v1/chat/completions", json={"messages": messages, "max_tokens": 8, **extra}
    )


def test_an_openai_follow_up_scores_only_what_is_new_once(
    client: TestClient, scored: list[str]
) -> None:
    first = "What is a good name for a cat?"
    r = ask(client, first)
    assert r.status_code == 200, r.text
    answer = r.json()["choices"][0]["message"]["content"]
    assert answer.strip()
    time.sleep(0.5)
    # An answer is checked as a message only if a client sends it back: nothing is spent on
    # one that never comes back.
    assert scored == [first]
    scored.clear()
    follow_up = "And one for a dog?"
    r = ask(client, first, answer, follow_up)
    assert r.status_code == 200, r.text
    # The new message first, then the answer sent back (beside generation); the first
    # message's verdict is remembered.
    assert scored == [follow_up, answer]
    scored.clear()
    second = r.json()["choices"][0]["message"]["content"]
    r = ask(client, first, answer, follow_up, second, "And for a horse?")
    assert r.status_code == 200, r.text
    assert scored == ["And for a horse?", second]
    # What is remembered is digests and verdicts: no text of the conversation.
    cache = moderator(client).verdicts
    assert len(cache) >= 3
    kept = repr(list(cache._entries.items()))
    assert first not in kept and follow_up not in kept


def test_a_blocked_message_stays_blocked_when_sent_again(
    client: TestClient, scored: list[str]
) -> None:
    r = ask(client, BAD)
    assert r.status_code == 400 and r.json()["error"]["code"] == "content_filter", r.text
    assert scored == [BAD]
    scored.clear()
    r = ask(client, BAD, "Sure.", "Thanks, go on.")
    assert r.status_code == 400 and r.json()["error"]["code"] == "content_filter", r.text
    assert scored == []  # refused from the remembered verdict, before anything was scored


def test_verdicts_are_remembered_per_user(client: TestClient, scored: list[str]) -> None:
    services = client.app.state.services

    async def another() -> str:
        user = await services.store.users.create("bob", role="member", tier="free")
        _, secret = await services.store.keys.create(user.id, "tests")
        return str(secret)

    bob = client.blocking_portal.call(another)
    text = "Where do herons nest in winter?"
    assert ask(client, text).status_code == 200
    assert ask(client, text).status_code == 200
    assert scored.count(text) == 1  # the same user: once
    r = client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": text}], "max_tokens": 8},
        headers=bearer(bob),
    )
    assert r.status_code == 200, r.text
    assert scored.count(text) == 2  # another user's identical text is checked for them


def test_a_policy_change_checks_texts_again(client: TestClient, scored: list[str]) -> None:
    mod = moderator(client)
    text = "You idiot, fix the printer."
    assert ask(client, text).status_code == 200
    assert ask(client, text).status_code == 200
    assert scored.count(text) == 1
    mod.policy = ModerationPolicy.from_dict(
        {"output": False, "rules": [{"name": "printers", "terms": ["printer"]}]}
    )
    r = ask(client, text)
    assert r.status_code == 400 and r.json()["error"]["code"] == "content_filter", r.text
    assert scored.count(text) == 2


def test_the_rest_of_a_long_message_is_checked_beside_generation_and_cuts_it(
    client: TestClient, scored: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = moderator(client)
    mod.policy = ModerationPolicy.from_dict(
        {"output": False, "rules": [{"name": "made-up", "terms": ["zorblax"]}]}
    )
    submitted: list[bool] = []
    real_submit, real_scores = completions.submit, Moderator.scores

    def submit(*args: Any) -> Any:
        submitted.append(True)
        return real_submit(*args)

    async def scores(self: Moderator, text: str, *args: Any, **kwargs: Any) -> dict[str, float]:
        if "zorblax" in text:  # the rest: it must not hold up the answer
            deadline = time.monotonic() + 30
            while not submitted and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        return await real_scores(self, text, *args, **kwargs)

    monkeypatch.setattr(completions, "submit", submit)
    monkeypatch.setattr(Moderator, "scores", scores)
    long = "Tell me about the rivers of Europe and their bridges. " * 16 + "And zorblax."
    r = ask(client, long, max_tokens=64)
    assert r.status_code == 200, r.text  # the head was fine: the answer started
    assert r.json()["choices"][0]["finish_reason"] == "content_filter"
    queue = client.get("/v1/admin/moderation").json()["data"]  # the block, without text
    assert [(i["direction"], i["category"], i["has_text"]) for i in queue] == [
        ("input", "rule", False)
    ]
    # Sent again, the remembered block refuses it before any model work.
    r = ask(client, long)
    assert r.status_code == 400 and r.json()["error"]["code"] == "content_filter", r.text


def test_the_cache_is_bounded_least_recently_used_first() -> None:
    cache = VerdictCache(max_entries=2)
    verdict = Verdict("allow", None, {})
    cache.put(b"a", verdict)
    cache.put(b"b", verdict)
    assert cache.get(b"a") is not None  # "b" is now the least recently used
    cache.put(b"c", verdict)
    assert cache.get(b"b") is None and cache.get(b"a") is not None and len(cache) == 2


def test_two_calls_sending_the_same_new_history_at_once_score_it_once(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script that sends two calls with the same history at once: the history's check
    beside the first call's generation serves the second too."""
    services = client.app.state.services
    answer = "Herons nest in tall trees near water, in colonies."
    scored: list[str] = []
    real = Moderator.scores

    async def scores(self: Moderator, text: str, *args: Any, **kwargs: Any) -> dict[str, float]:
        scored.append(text)
        if text == answer:
            await release.wait()  # the first check is under way until the test says so
        return await real(self, text, *args, **kwargs)

    monkeypatch.setattr(Moderator, "scores", scores)

    async def scenario() -> tuple[bool, bool]:
        nonlocal release
        release = asyncio.Event()
        user = await services.store.users.create("heron", role="member", tier="free")
        moderation = services.moderation
        screenings = [
            await moderation.screen_messages(user, ["Where do herons nest?", answer, ask])
            for ask in ("And in winter?", "And in spring?")
        ]
        first_rest, second_rest = (s.start_rest for s in screenings)
        assert first_rest is not None and second_rest is not None
        first = first_rest()
        while answer not in scored:
            await asyncio.sleep(0)
        second = second_rest()
        for _ in range(5):
            await asyncio.sleep(0)
        release.set()
        verdicts = await asyncio.gather(first, second)
        return verdicts[0].blocked, verdicts[1].blocked

    release: asyncio.Event
    assert client.blocking_portal.call(scenario) == (False, False)
    assert scored.count(answer) == 1  # scored once, by the check that was already under way
