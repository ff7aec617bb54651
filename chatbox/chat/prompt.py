"""Prompt assembly: system prompt plus as much recent history as the context allows."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from chatbox.engine.types import ChatMessage
from chatbox.store import Turn

CountTokens = Callable[[tuple[ChatMessage, ...]], int]


def turn_messages(turns: Sequence[Turn]) -> list[ChatMessage]:
    """History as chat messages; a failed answer with no text is left out, and so are
    tool calls and results (the answer that used them says what they gave)."""
    return [
        ChatMessage(role="user" if t.role == "user" else "assistant", content=t.content)
        for t in turns
        if t.role in ("user", "assistant") and (t.content or t.status == "complete")
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
    last = max(0, len(history) - 1)

    def window(start: int) -> tuple[ChatMessage, ...]:
        while start < last and history[start].role == "assistant":
            start += 1
        return head + tuple(history[start:])

    # Fewer messages never take more tokens, so binary-search the earliest start that fits:
    # O(log n) renders of the prompt instead of one per dropped turn.
    lo, hi = 0, last
    best: tuple[tuple[ChatMessage, ...], int] | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        messages = window(mid)
        tokens = count(messages)
        if tokens <= budget:
            best, hi = (messages, tokens), mid - 1
        else:
            lo = mid + 1
    if best is None:
        messages = window(last)
        return messages, count(messages)
    return best
