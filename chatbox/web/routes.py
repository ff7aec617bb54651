"""The route table: every controller of the web layer, with the error bodies each documents."""

from __future__ import annotations

from litestar.handlers import HTTPRouteHandler
from litestar.types import ControllerRouterHandler

from chatbox.web.api.conversations import ConversationController
from chatbox.web.api.data import DataController
from chatbox.web.api.knowledge import KnowledgeController
from chatbox.web.api.shares import SharePagesController, SharesController
from chatbox.web.api.tool_approvals import ToolApprovalController
from chatbox.web.api.workspaces import ConversationWorkspaceController, WorkspacesController
from chatbox.web.console.mcp import ConsoleToolsController
from chatbox.web.console.moderation import (
    ModerationAdminController,
    ModerationPagesController,
    ModerationsController,
)
from chatbox.web.console.operations import ConsoleOperationsController
from chatbox.web.console.pages import ConsoleController
from chatbox.web.console.replicas import ReplicasController
from chatbox.web.console.shadow import ConsoleShadowController, ShadowController
from chatbox.web.console.usage import AdminApiController, AdminPagesController
from chatbox.web.console.verdicts import ConsoleVerdictsController, EvalsApiController
from chatbox.web.console.workspaces import ConsoleWorkspacesController
from chatbox.web.errors import ERROR_RESPONSES, MORE_RESPONSES, OPENAI_EXCEPTION_HANDLERS
from chatbox.web.health import HealthController
from chatbox.web.openai.api import OpenAIController
from chatbox.web.openai.responses import ResponsesController
from chatbox.web.ui.attachments import AttachmentsController
from chatbox.web.ui.chat_controls import ChatControlsController
from chatbox.web.ui.data import DataPagesController
from chatbox.web.ui.knowledge import KnowledgePagesController
from chatbox.web.ui.library import LibraryController
from chatbox.web.ui.login import LoginController
from chatbox.web.ui.pages import PagesController
from chatbox.web.ui.sign_in import SignInController
from chatbox.web.ui.workspaces import WorkspacePagesController

ROUTE_HANDLERS: list[ControllerRouterHandler] = [
    ConversationController,
    ToolApprovalController,
    DataController,
    DataPagesController,
    OpenAIController,
    ResponsesController,
    HealthController,
    KnowledgeController,
    KnowledgePagesController,
    LibraryController,
    AttachmentsController,
    PagesController,
    LoginController,
    SignInController,
    AdminApiController,
    AdminPagesController,
    ConsoleController,
    ConsoleOperationsController,
    ConsoleWorkspacesController,
    ConsoleToolsController,
    ConsoleVerdictsController,
    EvalsApiController,
    ReplicasController,
    ShadowController,
    ConsoleShadowController,
    ModerationsController,
    ModerationAdminController,
    ModerationPagesController,
    SharesController,
    SharePagesController,
    WorkspacesController,
    ConversationWorkspaceController,
    WorkspacePagesController,
    ChatControlsController,
]


def _document_errors(controllers: list[ControllerRouterHandler]) -> None:
    """Every API route documents the error bodies it really sends (`chatbox.web.errors`), in
    place of Litestar's default validation-error schema, so the OpenAPI schema matches:
    the common ones, 413 where there is a body, 422 from the conversation and knowledge APIs
    (the OpenAI-compatible ones answer 400), 409 on a conversation, 415 on an upload."""
    for controller in controllers:
        base = str(getattr(controller, "path", "") or "")
        openai_style = getattr(controller, "exception_handlers", None) == OPENAI_EXCEPTION_HANDLERS
        for handler in vars(controller).values():
            if not isinstance(handler, HTTPRouteHandler):
                continue
            paths = [base.rstrip("/") + "/" + p.lstrip("/") for p in handler.paths]
            extra = set()
            if handler.http_methods & {"POST", "PUT", "PATCH"}:
                extra.add(413)
            if not openai_style and handler.exception_handlers != OPENAI_EXCEPTION_HANDLERS:
                extra.add(422)
            if any(p.startswith("/v1/conversations/") for p in paths):
                extra.add(409)
            if handler.request_max_body_size is None:
                extra.add(415)
            more = {status: MORE_RESPONSES[status] for status in sorted(extra)}
            handler.responses = {**ERROR_RESPONSES, **more, **(handler.responses or {})}


_document_errors(ROUTE_HANDLERS)
