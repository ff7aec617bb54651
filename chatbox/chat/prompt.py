"""Prompt assembly: system prompt plus as much recent history as the context allows."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from chatbox.engine.types import ChatMessage
from chatbox.store import Turn

CountTokens = Callable[[tuple[ChatMessage, ...]], int]


def turn_messages(turns: Sequence[Turn]) -> list[ChatMessage]:
    """History as chat messages; a failed answer with no text is left out."""
    return [
        ChatMessage(role=t.role, content=t.content)
        for t in turns
        if t.content or t.status == "complete"
    ]


def fit_history(
    system_prompt: str | None,
    history: Sequence[ChatMessage],
    budget: int,
    count: CountTokens,
) -> tuple[tuple[ChatMessage, ...], int]:
    """The longest suffix of history (always keeping the last message) within budget tokens.

    Returns the messages and their token count. Oldest turns go first; a leading assistant
    message is dropped too so the prompt starts with the user.
    """
    head = (ChatMessage("system", system_prompt),) if system_prompt else ()
    start = 0
    while True:
        window = list(history[start:])
        while len(window) > 1 and window[0].role == "assistant":
            window.pop(0)
            start += 1
        messages = head + tuple(window)
        tokens = count(messages)
        if tokens <= budget or start >= len(history) - 1:
            return messages, tokens
        start += 1
