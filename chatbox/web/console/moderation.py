"""Moderation over HTTP: `POST /v1/moderations` in OpenAI's shape, and the admin review queue
(JSON and pages). Showing an item and resolving it are recorded in the audit log."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, Literal

from litestar import Controller, Response, get, post
from litestar.exceptions import NotFoundException, PermissionDeniedException
from litestar.params import Parameter
from msgspec import Struct, convert

from chatbox.accounts import User
from chatbox.chat import InvalidInput
from chatbox.moderation import CATEGORIES, ModerationService, item_out
from chatbox.web.auth import AnyRequest
from chatbox.web.deps import ServicesDep, SettingsDep, UserDep
from chatbox.web.errors import ERROR_RESPONSES, OPENAI_EXCEPTION_HANDLERS
from chatbox.web.intake import MAX_ID, NonEmptyStrings
from chatbox.web.ui.helpers import UI_EXCEPTION_HANDLERS, html

MAX_INPUTS = 32
# OpenAI's sub-categories, from the seven scored here: (name, parent, also-needs).
_SUB = (
    ("harassment/threatening", "harassment", "violence"),
    ("hate/threatening", "hate", "violence"),
    ("illicit/violent", "illicit", "violence"),
    ("self-harm/intent", "self-harm", None),
    ("self-harm/instructions", "self-harm", None),
    ("violence/graphic", "violence", None),
)


@dataclass
class ModerationIn:
    input: str | NonEmptyStrings
    model: str | None = None


@dataclass
class ResolveIn:
    action: Literal["dismiss", "confirm"]


def _service(services: Any) -> ModerationService:
    moderation: ModerationService | None = services.moderation
    if moderation is None:
        raise NotFoundException("moderation is not configured")
    return moderation


def require_admin(user: User) -> None:
    if user.role != "admin":
        raise PermissionDeniedException("only admins can see the moderation queue")


class ModerationResultOut(Struct):
    """One result in OpenAI's shape; sub-categories derive from the seven scored ones."""

    flagged: bool
    categories: dict[str, bool]
    category_scores: dict[str, float]
    category_applied_input_types: dict[str, list[str]]

    @classmethod
    def of(
        cls, scores: dict[str, float], thresholds: dict[str, float], flagged: bool
    ) -> ModerationResultOut:
        s = {c: round(scores.get(c, 0.0), 6) for c in CATEGORIES}
        hit = {c: s[c] >= thresholds.get(c, 1.01) for c in CATEGORIES}
        for name, parent, also in _SUB:
            s[name] = min(s[parent], s[also]) if also else s[parent]
            hit[name] = hit[parent] and (also is None or hit[also])
        return cls(flagged or any(hit.values()), hit, s, {c: ["text"] for c in s})


class ModerationsOut(Struct):
    id: str
    model: str
    results: list[ModerationResultOut]


class ItemUser(Struct, forbid_unknown_fields=True):
    id: str | None
    name: str | None


class ModerationItemOut(Struct, forbid_unknown_fields=True):
    """A review queue item (no text: `has_text` says whether one is kept)."""

    id: str
    created_at: float
    user: ItemUser
    tier: str
    direction: str
    action: str
    category: str
    scores: dict[str, float]
    conversation_id: str | None
    turn_id: str | None
    source: str | None
    status: str
    resolved_by: str | None
    resolved_at: float | None
    has_text: bool


class ModerationItemTextOut(ModerationItemOut, forbid_unknown_fields=True):
    """An opened item, with its text where one is kept."""

    text: str | None


class ModerationQueueOut(Struct):
    data: list[ModerationItemOut]


class ModerationsController(Controller):
    path = "/v1"
    tags = ["openai"]
    exception_handlers = OPENAI_EXCEPTION_HANDLERS

    @post("/moderations", status_code=200, responses=ERROR_RESPONSES)
    async def moderations(
        self, services: ServicesDep, settings: SettingsDep, user: UserDep, data: ModerationIn
    ) -> ModerationsOut:
        """Classify text as OpenAI's moderation endpoint does (results[].flagged, ...)."""
        moderation = _service(services)
        texts = [data.input] if isinstance(data.input, str) else data.input
        if not texts or len(texts) > MAX_INPUTS:
            raise InvalidInput(f"input must hold 1 to {MAX_INPUTS} texts", "input")
        for i, text in enumerate(texts):
            if not isinstance(text, str) or len(text) > settings.max_message_chars:
                raise InvalidInput(
                    f"input[{i}] must be text of at most {settings.max_message_chars:,} characters",
                    "input",
                )
        thresholds = moderation.policy.tier(user.tier).thresholds
        results = []
        for text in texts:
            verdict = await moderation.check(user, text, "api")
            results.append(ModerationResultOut.of(verdict.scores, thresholds, verdict.flagged))
        return ModerationsOut("modr-" + secrets.token_hex(12), "chatbox-moderation", results)


class ModerationAdminController(Controller):
    path = "/v1/admin/moderation"
    tags = ["admin"]

    @get("/")
    async def queue(
        self,
        services: ServicesDep,
        user: UserDep,
        status: str = "open",
        limit: int = Parameter(default=100, ge=1, le=MAX_ID),
    ) -> ModerationQueueOut:
        """Flagged and filtered items, newest first (no text: open one to see it)."""
        require_admin(user)
        items = await _service(services).queue.items(None if status == "all" else status, limit)
        return ModerationQueueOut([convert(item_out(i), ModerationItemOut) for i in items])

    @get("/{item_id:str}")
    async def show(
        self, services: ServicesDep, user: UserDep, item_id: str
    ) -> ModerationItemTextOut:
        """One item with its text (where kept); recorded in the audit log."""
        require_admin(user)
        item = await _service(services).queue.show(user, item_id)
        if item is None:
            raise NotFoundException("no such moderation item")
        return convert(item_out(item, with_text=True), ModerationItemTextOut)

    @post("/{item_id:str}/resolve", status_code=200)
    async def resolve(
        self, services: ServicesDep, user: UserDep, item_id: str, data: ResolveIn
    ) -> ModerationItemOut:
        """Dismiss or confirm an item; recorded in the audit log."""
        require_admin(user)
        item = await _service(services).queue.resolve(user, item_id, data.action)
        if item is None:
            raise NotFoundException("no such moderation item")
        return convert(item_out(item), ModerationItemOut)


class ModerationPagesController(Controller):
    include_in_schema = False
    exception_handlers = UI_EXCEPTION_HANDLERS

    @get("/admin/moderation", name="moderation_queue")
    async def queue_page(
        self, request: AnyRequest, services: ServicesDep, user: UserDep, status: str = "open"
    ) -> Response[str]:
        require_admin(user)
        items = await _service(services).queue.items(None if status == "all" else status, 200)
        return html(request, "admin_moderation.html", items=items, status=status)

    @get("/admin/moderation/{item_id:str}", name="moderation_item")
    async def item_page(
        self, request: AnyRequest, services: ServicesDep, user: UserDep, item_id: str
    ) -> Response[str]:
        require_admin(user)
        item = await _service(services).queue.show(user, item_id)
        if item is None:
            raise NotFoundException("no such moderation item")
        return html(request, "admin_moderation_item.html", item=item)

    @post("/admin/moderation/{item_id:str}/resolve", status_code=200, name="moderation_resolve")
    async def resolve_page(
        self, request: AnyRequest, services: ServicesDep, user: UserDep, item_id: str
    ) -> Response[str]:
        require_admin(user)
        form = await request.form()
        action = form.get("action")
        if action not in ("dismiss", "confirm"):
            raise InvalidInput("action must be dismiss or confirm", "action")
        item = await _service(services).queue.resolve(user, item_id, action)
        if item is None:
            raise NotFoundException("no such moderation item")
        return html(request, "admin_moderation_item.html", item=item)
