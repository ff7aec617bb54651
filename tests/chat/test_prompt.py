"""Prompt assembly keeps the newest history that fits the context budget."""

from __future__ import annotations

from chatbox.chat.prompt import fit_history
from chatbox.engine.types import ChatMessage


def words(messages: tuple[ChatMessage, ...]) -> int:
    return sum(len(m.content.split()) + 1 for m in messages)


def test_everything_fits() -> None:
    history = [ChatMessage("user", "a b"), ChatMessage("assistant", "c"), ChatMessage("user", "d")]
    messages, tokens = fit_history("sys", history, 100, words)
    assert [m.content for m in messages] == ["sys", "a b", "c", "d"]
    assert tokens == words(messages)


def test_oldest_turns_go_first_and_the_prompt_starts_with_the_user() -> None:
    history = [
        ChatMessage("user", "one two three four"),
        ChatMessage("assistant", "five six"),
        ChatMessage("user", "seven"),
        ChatMessage("assistant", "eight"),
        ChatMessage("user", "nine"),
    ]
    messages, tokens = fit_history("sys", history, 8, words)
    assert messages[0] == ChatMessage("system", "sys")
    assert messages[1].role == "user"
    assert messages[-1].content == "nine"
    assert tokens <= 8


def test_fit_matches_dropping_one_turn_at_a_time() -> None:
    import random

    def reference(history: list[ChatMessage], budget: int) -> tuple[ChatMessage, ...]:
        start = 0
        while True:
            window = list(history[start:])
            while len(window) > 1 and window[0].role == "assistant":
                window.pop(0)
                start += 1
            messages = (ChatMessage("system", "s"), *window)
            if words(messages) <= budget or start >= len(history) - 1:
                return messages
            start += 1

    rng = random.Random(7)
    for _ in range(300):
        history = [
            ChatMessage(rng.choice(["user", "assistant"]), "w " * rng.randint(0, 6))
            for _ in range(rng.randint(0, 9))
        ]
        budget = rng.randint(1, 40)
        messages, tokens = fit_history("s", history, budget, words)
        assert messages == reference(history, budget)
        assert tokens == words(messages)
