"""Request and response bodies of the conversation API.

Response bodies are typed structs (Litestar documents them in the OpenAPI schema); each has
an `of` that builds it from the service's record, and encodes its fields in declared order.
"""

from __future__ import annotations

from dataclasses import dataclass

from msgspec import Struct
from msgspec.structs import asdict

from chatbox.chat import (
    Conversation,
    ConversationView,
    Feedback,
    Summary,
    Turn,
    TurnOptions,
    TurnView,
)
from chatbox.web.intake import NonEmptyText


@dataclass
class NewConversation:
    title: str | None = None
    system_prompt: str | None = None
    model: str | None = None
    temporary: bool = False  # held in RAM only, never stored (zero-data-retention)


@dataclass
class ConversationPatch:
    title: str | None = None
    system_prompt: str | None = None
    model: str | None = None


@dataclass
class TurnIn:
    """A user message, with optional per-turn generation options."""

    content: NonEmptyText
    parent_id: str | None = None  # branch from here (edit); default: the active branch
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    stop: list[str] | None = None

    def options(self) -> TurnOptions:
        return TurnOptions(
            self.model,
            self.temperature,
            self.top_p,
            self.max_tokens,
            self.seed,
            tuple(self.stop or ()),
        )


@dataclass
class FeedbackIn:
    """A rating of an answer, and optionally why (each change is kept; the newest counts)."""

    rating: str  # "up" or "down"
    comment: str | None = None


class FeedbackOut(Struct):
    """The caller's rating of an answer that counts now (rating null: not rated)."""

    turn_id: str
    rating: str | None
    comment: str | None
    model: str | None
    created_at: float | None

    @classmethod
    def of(cls, given: Feedback | None, turn_id: str) -> FeedbackOut:
        if given is None:
            return cls(turn_id, None, None, None, None)
        return cls(turn_id, given.rating, given.comment, given.model, given.created_at)


@dataclass
class RegenerateIn:
    model: str | None = None
    temperature: float | None = None
    seed: int | None = None

    def options(self) -> TurnOptions:
        return TurnOptions(model=self.model, temperature=self.temperature, seed=self.seed)


@dataclass
class BranchIn:
    turn_id: str


class ConversationOut(Struct):
    id: str
    title: str | None
    system_prompt: str | None
    model: str | None
    created_at: float
    updated_at: float

    @classmethod
    def of(cls, conv: Conversation) -> ConversationOut:
        return cls(
            conv.id, conv.title, conv.system_prompt, conv.model, conv.created_at, conv.updated_at
        )


class ConversationsOut(Struct):
    data: list[ConversationOut]


class TokenCounts(Struct):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


class TurnOut(Struct):
    id: str
    parent_id: str | None
    role: str
    content: str
    status: str
    model: str | None
    created_at: float
    cursor: int
    error: str | None
    route: str | None
    arm: str | None
    degraded_from: str | None
    usage: TokenCounts

    @classmethod
    def of(cls, turn: Turn) -> TurnOut:
        return cls(
            turn.id,
            turn.parent_id,
            turn.role,
            turn.content,
            turn.status,
            turn.model,
            turn.created_at,
            turn.seq,
            turn.error,
            turn.route,
            turn.arm,
            turn.degraded_from,
            TokenCounts(turn.prompt_tokens, turn.completion_tokens, turn.cached_tokens),
        )


class BranchTurnOut(TurnOut):
    """A turn of the shown branch, with its versions and the caller's rating."""

    siblings: list[str]
    sibling_index: int
    my_rating: str | None  # the caller's

    @classmethod
    def of_view(cls, tv: TurnView) -> BranchTurnOut:
        return cls(
            **asdict(TurnOut.of(tv.turn)),
            siblings=tv.sibling_ids,
            sibling_index=tv.sibling_index,
            my_rating=tv.rating.rating if tv.rating else None,
        )


class ContextOut(Struct):
    used: int
    limit: int
    hidden_turn_ids: list[str]  # the model cannot see these
    summarising: bool


class SummaryOut(Struct):
    """The summary the model reads instead of the branch's turns up to `covers_turn_id`."""

    id: str
    role: str
    covers_turn_id: str
    covered_turns: int
    content: str
    model: str | None
    created_at: float

    @classmethod
    def of(cls, summary: Summary) -> SummaryOut:
        return cls(
            summary.id,
            "summary",
            summary.covers_id,
            summary.covered,
            summary.content,
            summary.model,
            summary.created_at,
        )


class ConversationViewOut(ConversationOut):
    """A conversation with a page of its shown branch's turns."""

    effective_model: str
    turns: list[BranchTurnOut]
    next_cursor: int | None
    running_turn_id: str | None
    context: ContextOut
    summary: SummaryOut | None

    @classmethod
    def of_view(cls, view: ConversationView) -> ConversationViewOut:
        return cls(
            **asdict(ConversationOut.of(view.conversation)),
            effective_model=view.model,
            turns=[BranchTurnOut.of_view(tv) for tv in view.turns],
            next_cursor=view.next_cursor,
            running_turn_id=view.running.turn_id if view.running else None,
            context=ContextOut(
                view.context_used, view.context_limit, list(view.hidden_ids), view.summarising
            ),
            summary=SummaryOut.of(view.summary) if view.summary else None,
        )
