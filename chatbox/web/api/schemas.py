"""Request and response bodies of the conversation API.

Response bodies are typed structs (Litestar documents them in the OpenAPI schema); each has
an `of` that builds it from the service's record, and encodes its fields in declared order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TypeVar

from msgspec import Struct

from chatbox.chat import (
    ConversationView,
    Feedback,
    InvalidInput,
    Summary,
    Turn,
    TurnOptions,
    TurnView,
)
from chatbox.web.intake import NonEmptyText

S = TypeVar("S", bound=Struct)


def pick(struct: type[S], record: object, /, **given: Any) -> S:
    """A response struct of the record's attributes of the same names; `given` supplies the
    fields the record lacks or names otherwise."""
    fields = struct.__struct_fields__
    return struct(**{f: given[f] if f in given else getattr(record, f) for f in fields})


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
    presence_penalty: float = 0.0  # -2..2, as in the OpenAI API
    frequency_penalty: float = 0.0
    fresh: bool = False  # a new answer even where the semantic cache holds one
    # The assistant's tools: "none" (default: none offered), "auto" (offered; it decides),
    # "required" (it calls one before answering), or tool names (it calls each first, in
    # order, then answers).
    tool_choice: str | list[str] | None = None

    def options(self) -> TurnOptions:
        choice, forced = tool_choice_in(self.tool_choice)
        return TurnOptions(
            self.model,
            self.temperature,
            self.top_p,
            self.max_tokens,
            self.seed,
            tuple(self.stop or ()),
            presence_penalty=_penalty(self.presence_penalty, "presence_penalty"),
            frequency_penalty=_penalty(self.frequency_penalty, "frequency_penalty"),
            fresh=self.fresh,
            tool_choice=choice,
            force_tools=forced,
        )


def _penalty(value: float, name: str) -> float:
    if not -2.0 <= value <= 2.0:
        raise InvalidInput(f"{name} must be between -2 and 2", name)
    return value


MAX_FORCED_TOOLS = 16


def tool_choice_in(raw: str | list[str] | None) -> tuple[str, tuple[str, ...]]:
    """(auto | none | required, tools to call first) from a request's `tool_choice`."""
    if raw is None:
        return "none", ()
    if isinstance(raw, str):
        return (raw, ()) if raw in ("auto", "none", "required") else ("auto", (raw,))
    if len(raw) > MAX_FORCED_TOOLS or not all(isinstance(n, str) and n for n in raw):
        raise InvalidInput(
            f"tool_choice: at most {MAX_FORCED_TOOLS} tool names, each a non-empty string",
            "tool_choice",
        )
    return "auto", tuple(raw)


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


def tool_out(turn: Turn) -> dict[str, Any] | None:
    """A tool turn's call or result as data (its content is that JSON)."""
    if turn.role not in ("tool_call", "tool_result"):
        return None
    try:
        data = json.loads(turn.content)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


class ConversationsOut(Struct):
    data: list[ConversationOut]


class TokenCounts(Struct):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


class TurnOut(Struct, omit_defaults=True, kw_only=True):
    """A turn; a tool turn also carries its call or result as data (`tool`)."""

    tool: dict[str, Any] | None = None
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

    @staticmethod
    def renamed(turn: Turn) -> dict[str, Any]:
        """The fields a turn names otherwise."""
        usage = TokenCounts(turn.prompt_tokens, turn.completion_tokens, turn.cached_tokens)
        return {"cursor": turn.seq, "usage": usage, "tool": tool_out(turn)}


class BranchTurnOut(TurnOut):
    """A turn of the shown branch, with its versions and the caller's rating."""

    siblings: list[str]
    sibling_index: int
    my_rating: str | None  # the caller's

    @classmethod
    def of(cls, tv: TurnView) -> BranchTurnOut:
        rating = tv.rating.rating if tv.rating else None
        return pick(
            cls,
            tv.turn,
            **TurnOut.renamed(tv.turn),
            siblings=tv.sibling_ids,
            sibling_index=tv.sibling_index,
            my_rating=rating,
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
    def of(cls, s: Summary) -> SummaryOut:
        return pick(cls, s, role="summary", covers_turn_id=s.covers_id, covered_turns=s.covered)


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
        context = ContextOut(
            view.context_used, view.context_limit, list(view.hidden_ids), view.summarising
        )
        return pick(
            cls,
            view.conversation,
            effective_model=view.model,
            turns=[BranchTurnOut.of(tv) for tv in view.turns],
            next_cursor=view.next_cursor,
            running_turn_id=view.running.turn_id if view.running else None,
            context=context,
            summary=SummaryOut.of(view.summary) if view.summary else None,
        )
