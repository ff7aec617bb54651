"""The knowledge hook of a turn: extra context (memory, document passages) and citations.

The chat layer defines what it needs; `chatbox.knowledge` implements it and `app` wires it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

CountText = Callable[[str], int]  # tokens a piece of prompt text takes


@dataclass(frozen=True)
class Citation:
    """A document passage a turn's prompt included; `n` is its [n] mark in the prompt."""

    n: int
    chunk_id: int
    document_id: str
    document_name: str
    page: int | None
    score: float
    text: str

    def as_dict(self) -> dict[str, Any]:
        return {"n": self.n, "chunk_id": self.chunk_id, "document_id": self.document_id,
                "document_name": self.document_name, "page": self.page,
                "score": round(self.score, 4), "text": self.text}


@dataclass(frozen=True)
class TurnContext:
    """What retrieval adds to one turn's prompt."""

    text: str = ""  # placed before the user's message; empty: nothing relevant
    citations: tuple[Citation, ...] = ()
    memory_ids: tuple[str, ...] = ()
    tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class ContextProvider(Protocol):
    async def for_turn(
        self, user_id: str, conversation_id: str, query: str, budget_tokens: int,
        count: CountText,
    ) -> TurnContext:
        """Relevant memory facts and passages for `query`, within budget_tokens."""
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
