"""Request and response bodies of the conversation API."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chatbox.chat import (
    Conversation,
    ConversationView,
    Feedback,
    Summary,
    Turn,
    TurnOptions,
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
    fresh: bool = False  # a new answer even where the semantic cache holds one

    def options(self) -> TurnOptions:
        return TurnOptions(
            self.model,
            self.temperature,
            self.top_p,
            self.max_tokens,
            self.seed,
            tuple(self.stop or ()),
            fresh=self.fresh,
        )


@dataclass
class FeedbackIn:
    """A rating of an answer, and optionally why (each change is kept; the newest counts)."""

    rating: str  # "up" or "down"
    comment: str | None = None


def feedback_out(given: Feedback | None, turn_id: str) -> dict[str, Any]:
    """The caller's rating of an answer that counts now (rating null: not rated)."""
    return {
        "turn_id": turn_id,
        "rating": given.rating if given else None,
        "comment": given.comment if given else None,
        "model": given.model if given else None,
        "created_at": given.created_at if given else None,
    }


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


def conversation_out(conv: Conversation) -> dict[str, Any]:
    return {
        "id": conv.id,
        "title": conv.title,
        "system_prompt": conv.system_prompt,
        "model": conv.model,
        "created_at": conv.created_at,
        "updated_at": conv.updated_at,
    }


def turn_out(turn: Turn) -> dict[str, Any]:
    return {
        "id": turn.id,
        "parent_id": turn.parent_id,
        "role": turn.role,
        "content": turn.content,
        "status": turn.status,
        "model": turn.model,
        "created_at": turn.created_at,
        "cursor": turn.seq,
        "error": turn.error,
        "route": turn.route,
        "arm": turn.arm,
        "degraded_from": turn.degraded_from,
        "usage": {
            "prompt_tokens": turn.prompt_tokens,
            "completion_tokens": turn.completion_tokens,
            "cached_tokens": turn.cached_tokens,
        },
    }


def view_out(view: ConversationView) -> dict[str, Any]:
    return {
        **conversation_out(view.conversation),
        "effective_model": view.model,
        "turns": [
            {
                **turn_out(tv.turn),
                "siblings": tv.sibling_ids,
                "sibling_index": tv.sibling_index,
                "my_rating": tv.rating.rating if tv.rating else None,  # the caller's
            }
            for tv in view.turns
        ],
        "next_cursor": view.next_cursor,
        "running_turn_id": view.running.turn_id if view.running else None,
        "context": {
            "used": view.context_used,
            "limit": view.context_limit,
            "hidden_turn_ids": list(view.hidden_ids),  # the model cannot see these
            "summarising": view.summarising,
        },
        "summary": summary_out(view.summary) if view.summary else None,
    }


def summary_out(summary: Summary) -> dict[str, Any]:
    """The summary the model reads instead of the branch's turns up to `covers_turn_id`."""
    return {
        "id": summary.id,
        "role": "summary",
        "covers_turn_id": summary.covers_id,
        "covered_turns": summary.covered,
        "content": summary.content,
        "model": summary.model,
        "created_at": summary.created_at,
    }
