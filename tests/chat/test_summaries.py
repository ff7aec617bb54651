"""Long conversations: what a turn sends once the branch has a summary, what is hidden
without one, when a summary is due and what it covers (one token per word here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chatbox.chat.summaries import (
    SUMMARY_HEADING,
    plan_cover,
    sent_window,
    summary_messages,
    trigger_tokens,
)
from chatbox.engine.types import ChatMessage
from chatbox.store import Store, Summary, Turn
from chatbox.store.erasure import ErasureRepo


def words(messages: tuple[ChatMessage, ...]) -> int:
    return sum(len(m.content.split()) + 1 for m in messages)


def turn(i: int, role: str, text: str, status: str = "complete") -> Turn:
    return Turn(
        f"t{i}", i, "c", f"t{i - 1}" if i else None, role, text, status, None, 0, 0, 0, None, 0.0
    )  # type: ignore[arg-type]


def chat(n: int, size: int = 5) -> list[Turn]:
    """n exchanges of `size`-word messages: t0 user, t1 assistant, ..."""
    return [
        turn(i, "user" if i % 2 == 0 else "assistant", " ".join([f"w{i}"] * size))
        for i in range(2 * n)
    ]


def summary(covers: str, text: str = "they talked about w") -> Summary:
    return Summary("s1", 1, "c", covers, int(covers[1:]) + 1, text, None, 0.0)


def test_without_a_summary_the_oldest_turns_are_hidden_and_named() -> None:
    path = chat(6)  # 12 messages of 6 tokens
    window = sent_window("sys", None, path, 40, words)
    assert window.tokens <= 40
    assert window.messages[0] == ChatMessage("system", "sys")
    assert window.messages[-1].content == path[-1].content
    shown = len(window.messages) - 1
    assert window.hidden == tuple(t.id for t in path[: len(path) - shown])
    assert window.hidden and window.messages[1].role == "user"


def test_with_a_summary_the_prompt_is_system_summary_and_the_turns_after_it() -> None:
    path = chat(6)
    window = sent_window("sys", summary("t5"), path, 1000, words)
    assert window.messages[0] == ChatMessage(
        "system", f"sys\n\n{SUMMARY_HEADING}\nthey talked about w"
    )
    assert [m.content for m in window.messages[1:]] == [t.content for t in path[6:]]
    assert window.hidden == ()


def test_a_summary_off_this_branch_is_not_used() -> None:
    path = chat(3)
    window = sent_window(None, summary("t9"), path, 1000, words)
    assert [m.content for m in window.messages] == [t.content for t in path]


def test_no_summary_is_due_under_the_trigger() -> None:
    path = chat(2)  # 24 tokens
    assert plan_cover("sys", None, path, 100, 60, words) == []
    assert trigger_tokens(0.0, 1000, 900) == 0  # off
    assert plan_cover("sys", None, chat(50), 100, 0, words) == []


def test_the_trigger_comes_before_turns_must_be_dropped() -> None:
    assert trigger_tokens(0.6, 1000, 900) == 600
    assert trigger_tokens(0.6, 1000, 500) == 400  # a big answer budget: 80% of what is left


def test_past_the_trigger_the_oldest_part_is_covered_and_the_recent_part_kept() -> None:
    path = chat(8)  # 96 tokens
    cover = plan_cover("sys", None, path, 120, 60, words)
    kept = path[len(cover) :]
    assert cover == path[: len(cover)] and 0 < len(cover) < len(path)
    assert kept[0].role == "user"
    assert words(tuple(ChatMessage(t.role, t.content) for t in kept)) <= 30  # half the trigger
    # With that summary in place the prompt is back under the trigger: nothing more is due.
    done = summary(cover[-1].id, "short")
    assert plan_cover("sys", done, path, 120, 60, words) == []


def test_summaries_roll_covering_the_previous_one() -> None:
    path = chat(16)
    first = summary("t5")
    cover = plan_cover("sys", first, path, 120, 60, words)
    assert cover and cover[0].id == "t6"  # continues after what the first one covers
    messages = summary_messages(first, cover, 500, words)
    assert messages is not None and "they talked about w" in messages[1].content
    assert all(t.content in messages[1].content for t in cover)


def test_a_last_message_longer_than_the_kept_part_is_covered_too() -> None:
    path = [turn(0, "user", "a " * 10), turn(1, "assistant", "b " * 200)]
    assert plan_cover(None, None, path, 300, 100, words) == path


def test_the_summary_request_is_clipped_to_its_budget() -> None:
    path = [turn(i, "user" if i % 2 == 0 else "assistant", "x " * 300) for i in range(6)]
    messages = summary_messages(summary("t1", "y " * 500), path, 400, words)
    assert messages is not None and words(messages) <= 400
    assert "Summarise" in messages[1].content and "y y" in messages[1].content
    assert summary_messages(None, path, 20, words) is None  # not even the instructions fit


@pytest.fixture
async def store(database: Path | str):  # type: ignore[no-untyped-def]
    s = await Store.open(database)
    yield s
    await s.close()


async def test_a_summary_belongs_to_the_branches_holding_its_turns(store: Store) -> None:
    user = await store.users.create("ana")
    conv = await store.conversations.create(user.id, None, None, None)
    a = await store.turns.append_user(conv.id, None, "first")
    b = await store.turns.append_user(conv.id, a.id, "second")
    c = await store.turns.append_user(conv.id, b.id, "third")
    edited = await store.turns.append_user(conv.id, a.id, "second, edited")  # a sibling of b
    s1 = await store.summaries.add(conv.id, a.id, 1, "about first", "tiny")
    s2 = await store.summaries.add(conv.id, b.id, 2, "about first and second", "tiny")
    main = [t.id for t in await store.turns.path(conv.id, c.id)]
    other = [t.id for t in await store.turns.path(conv.id, edited.id)]
    assert await store.summaries.on_path(conv.id, main) == s2
    assert await store.summaries.on_path(conv.id, other) == s1  # b is not on this branch
    assert await store.summaries.on_path(conv.id, []) is None


async def test_summaries_are_append_only_and_go_with_an_erased_conversation(store: Any) -> None:
    user = await store.users.create("ana")
    conv = await store.conversations.create(user.id, None, None, None)
    a = await store.turns.append_user(conv.id, None, "first")
    s = await store.summaries.add(conv.id, a.id, 1, "about first", "tiny")
    for sql in ("UPDATE summaries SET content = 'x'", "DELETE FROM summaries"):
        with pytest.raises(Exception, match=r"append-only|erased"):
            async with store.db.transaction() as tx:
                await tx.execute(sql)
    assert await store.summaries.on_path(conv.id, [a.id]) == s
    await ErasureRepo(store.db).conversations(user.id, [conv.id])
    rows = await store.db.fetchall("SELECT * FROM summaries")
    assert rows == []
