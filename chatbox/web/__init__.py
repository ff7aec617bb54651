"""The web layer: HTML pages, the conversation API, the OpenAI-compatible API, health."""

from __future__ import annotations

from litestar.handlers import HTTPRouteHandler
from litestar.types import ControllerRouterHandler

from chatbox.web.admin import AdminApiController, AdminPagesController
from chatbox.web.attachments import AttachmentsController
from chatbox.web.chat_controls import ChatControlsController
from chatbox.web.console import ConsoleController
from chatbox.web.console_workspaces import ConsoleWorkspacesController
from chatbox.web.conversations import ConversationController
from chatbox.web.data import DataController
from chatbox.web.data_pages import DataPagesController
from chatbox.web.errors import ERROR_RESPONSES
from chatbox.web.health import HealthController
from chatbox.web.knowledge import KnowledgeController
from chatbox.web.knowledge_pages import KnowledgePagesController
from chatbox.web.library import LibraryController
from chatbox.web.login import LoginController
from chatbox.web.moderation import (
    ModerationAdminController,
    ModerationPagesController,
    ModerationsController,
)
from chatbox.web.openai_api import OpenAIController
from chatbox.web.pages import PagesController
from chatbox.web.replicas import ReplicasController
from chatbox.web.sharing import SharePagesController, SharesController
from chatbox.web.workspace_pages import WorkspacePagesController
from chatbox.web.workspaces import ConversationWorkspaceController, WorkspacesController

ROUTE_HANDLERS: list[ControllerRouterHandler] = [
    ConversationController,
    DataController,
    DataPagesController,
    OpenAIController,
    HealthController,
    KnowledgeController,
    KnowledgePagesController,
    LibraryController,
    AttachmentsController,
    PagesController,
    LoginController,
    AdminApiController,
    AdminPagesController,
    ConsoleController,
    ConsoleWorkspacesController,
    ReplicasController,
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
    """Every API route documents the error body it really sends (`chatbox.web.errors`), in
    place of Litestar's default validation-error schema, so the OpenAPI schema matches."""
    for controller in controllers:
        for handler in vars(controller).values():
            if isinstance(handler, HTTPRouteHandler):
                handler.responses = {**ERROR_RESPONSES, **(handler.responses or {})}


_document_errors(ROUTE_HANDLERS)
