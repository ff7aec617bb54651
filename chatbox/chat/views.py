"""Read-side shapes of a conversation: the active branch with its sibling branches."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from chatbox.chat.running.runs import TurnRun
from chatbox.store import Conversation, Feedback, Summary, Turn


@dataclass(frozen=True)
class ModerationMark:
    """What moderation said of a turn, as its bubble shows it (plainly, to its reader)."""

    action: str  # warn | flag | block (block: an answer cut, status `filtered`)
    category: str
    status: str = "open"  # the review item's state: open, noted, dismissed, confirmed
    notice: str | None = None  # a cut answer's notice, while it is known only from its run

    @property
    def label(self) -> str:
        if self.action == "block":
            return f"filtered: {self.category}"
        if self.action == "warn":
            return f"warning: {self.category}"
        if self.status == "confirmed":
            return f"flagged: {self.category} (reviewed)"
        return f"flagged for review: {self.category}"

    @property
    def explanation(self) -> str:
        """The badge's tooltip."""
        if self.action == "block":
            return "Moderation stopped this answer; its text was replaced by a notice."
        if self.action == "warn":
            return "Moderation noted this message under the service's policy."
        return "Moderation flagged this message; an administrator may review it."


_SEVERITY = {"warn": 1, "flag": 2, "block": 3}


def strongest(marks: Iterable[ModerationMark]) -> ModerationMark | None:
    """The mark a turn shows when moderation said several things of it."""
    return max(marks, key=lambda m: _SEVERITY.get(m.action, 0), default=None)


def run_marks(run: TurnRun) -> dict[str, ModerationMark]:
    """A running or finished answer's marks from its `moderation` events, by direction
    (input: the message; output: the answer). Temporary chats have nothing else."""
    found: dict[str, list[ModerationMark]] = {}
    for event in run.events:
        if event.kind == "moderation" and event.data.get("category"):
            data = event.data
            mark = ModerationMark(
                str(data["action"]), str(data["category"]), notice=data.get("message")
            )
            found.setdefault(str(event.data.get("direction", "output")), []).append(mark)
    return {d: m for d, marks in found.items() if (m := strongest(marks)) is not None}


@dataclass(frozen=True)
class TurnView:
    turn: Turn
    sibling_ids: list[str]  # this turn and its alternatives (same parent), oldest first
    mark: ModerationMark | None = None  # warned, flagged or filtered by moderation
    rating: Feedback | None = None  # the viewer's rating of an answer that counts now

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
    may_configure: bool = True  # the reader may change its title, system prompt and model

    @property
    def hidden_count(self) -> int:
        return len(self.hidden_ids)
