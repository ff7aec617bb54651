"""Plain records returned by the store; no SQL types leak past it."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any, Literal

TurnStatus = Literal["complete", "stopped", "failed", "interrupted", "filtered"]
Role = Literal["user", "assistant", "tool_call", "tool_result"]


def new_id(prefix: str) -> str:
    """A short, unguessable, roughly time-ordered id such as `c_0193a1b2c3d4e5f6a7b8`."""
    return f"{prefix}_{int(time.time() * 1000):011x}{secrets.token_hex(6)}"


@dataclass(frozen=True)
class User:
    id: str
    name: str
    role: str
    tier: str
    disabled: bool
    created_at: float

    @classmethod
    def from_row(cls, row: Any) -> User:
        return cls(
            row["id"],
            row["name"],
            row["role"],
            row["tier"],
            bool(row["disabled"]),
            row["created_at"],
        )


@dataclass(frozen=True)
class Conversation:
    id: str
    user_id: str
    title: str | None
    system_prompt: str | None
    model: str | None
    active_leaf_id: str | None
    created_at: float
    updated_at: float
    workspace_id: str | None = None  # shared with a workspace's members (chatbox/store/workspaces)

    @classmethod
    def from_row(cls, row: Any) -> Conversation:
        return cls(
            row["id"],
            row["user_id"],
            row["title"],
            row["system_prompt"],
            row["model"],
            row["active_leaf_id"],
            row["created_at"],
            row["updated_at"],
            row["workspace_id"] if "workspace_id" in row.keys() else None,  # noqa: SIM118 (a Row)
        )


@dataclass(frozen=True)
class Turn:
    id: str
    seq: int
    conversation_id: str
    parent_id: str | None
    role: Role
    content: str
    status: TurnStatus
    model: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    error: str | None
    created_at: float
    route: str | None = None  # how the model was chosen (tier, pin, auto-small, canary, ...)
    arm: str | None = None  # the experiment arm, for comparing a canary's answers
    degraded_from: str | None = None  # the model it would have used had the box not been busy
    author_id: str | None = None  # who wrote a user turn (a workspace has several writers)

    @classmethod
    def from_row(cls, row: Any) -> Turn:
        return cls(
            row["id"],
            row["seq"],
            row["conversation_id"],
            row["parent_id"],
            row["role"],
            row["content"],
            row["status"],
            row["model"],
            row["prompt_tokens"],
            row["completion_tokens"],
            row["cached_tokens"],
            row["error"],
            row["created_at"],
            row["route"],
            row["arm"],
            row["degraded_from"],
            row["author_id"] if "author_id" in row.keys() else None,  # noqa: SIM118 (a Row)
        )


@dataclass(frozen=True)
class Routing:
    """How an answer's model was chosen."""

    route: str | None = None
    arm: str | None = None
    degraded_from: str | None = None


@dataclass(frozen=True)
class TurnUsage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
