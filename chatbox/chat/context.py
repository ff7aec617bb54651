"""The knowledge hook of a turn: extra context (memory, document passages) and citations.

The chat layer says what it needs; `chatbox.knowledge` implements it and `app` wires it.
"""

from __future__ import annotations

from typing import Protocol

from chatbox.knowledge.types import Citation, CountText, TurnContext

__all__ = ["Citation", "ContextProvider", "CountText", "TurnContext", "with_context"]


class ContextProvider(Protocol):
    async def for_turn(
        self,
        user_id: str,
        conversation_id: str,
        query: str,
        budget_tokens: int,
        count: CountText,
        workspace_id: str | None = None,
    ) -> TurnContext:
        """Relevant memory facts and passages for `query`, within budget_tokens (for a
        workspace conversation: its workspace's passages only)."""
        ...

    async def turn_finished(
        self, user_id: str, conversation_id: str, turn_id: str, context: TurnContext
    ) -> None:
        """The answer was stored as turn_id: record its citations, schedule background work."""
        ...


def with_context(message: str, context: TurnContext) -> str:
    """The user's message as the model sees it, the retrieved context first.

    Context goes into the newest user message rather than the system prompt so the
    conversation's cached prefix (every earlier message) stays byte-identical.
    """
    if not context.text:
        return message
    return f"{context.text}\n\n---\n\n{message}"
