"""What retrieval adds to a turn: context text and the passages it cites (plain data)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

CountText = Callable[[str], int]  # tokens a piece of prompt text takes
# Moderation's screen (wired by chatbox.services.server): (user id, texts, "document" | "memory",
# a name for the message) -> why they are refused, or None to go on.
Screen = Callable[[str, Sequence[str], str, str], Awaitable[str | None]]
KeepsNothing = Callable[[str], Awaitable[bool]]  # zero-data-retention for this user id


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
        return {
            "n": self.n,
            "chunk_id": self.chunk_id,
            "document_id": self.document_id,
            "document_name": self.document_name,
            "page": self.page,
            "score": round(self.score, 4),
            "text": self.text,
        }


@dataclass(frozen=True)
class TurnContext:
    """What retrieval adds to one turn's prompt."""

    text: str = ""  # placed before the user's message; empty: nothing relevant
    citations: tuple[Citation, ...] = ()
    memory_ids: tuple[str, ...] = ()
    tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    remembered: tuple[str, ...] = ()  # facts the message asked to keep, as saved to memory
