"""Read-side shapes of a conversation: the active branch with its sibling branches."""

from __future__ import annotations

from dataclasses import dataclass

from chatbox.chat.runs import TurnRun
from chatbox.store import Conversation, Summary, Turn


@dataclass(frozen=True)
class TurnView:
    turn: Turn
    sibling_ids: list[str]  # this turn and its alternatives (same parent), oldest first

    @property
    def sibling_index(self) -> int:
        return self.sibling_ids.index(self.turn.id)

    @property
    def sibling_count(self) -> int:
        return len(self.sibling_ids)

    @property
    def prev_sibling(self) -> str | None:
        i = self.sibling_index
        return self.sibling_ids[i - 1] if i > 0 else None

    @property
    def next_sibling(self) -> str | None:
        i = self.sibling_index
        return self.sibling_ids[i + 1] if i + 1 < len(self.sibling_ids) else None


@dataclass(frozen=True)
class ConversationView:
    conversation: Conversation
    turns: list[TurnView]  # the requested page of the active branch, oldest first
    running: TurnRun | None
    model: str
    context_used: int
    context_limit: int
    next_cursor: int | None  # pass as `before` for the older page
    shown_leaf: str | None = None  # set when showing a branch other than the active one
    summary: Summary | None = None  # the newest summary on the branch: sent for what it covers
    hidden_ids: tuple[str, ...] = ()  # turns the model cannot see (not summarised, not sent)
    summarising: bool = False  # a summary of this conversation is being written now

    @property
    def hidden_count(self) -> int:
        return len(self.hidden_ids)
