"""The web layer: HTML pages, the conversation API, the OpenAI-compatible API, health."""

from __future__ import annotations

from litestar.types import ControllerRouterHandler

from chatbox.web.admin import AdminApiController, AdminPagesController
from chatbox.web.attachments import AttachmentsController
from chatbox.web.conversations import ConversationController
from chatbox.web.health import HealthController
from chatbox.web.knowledge import KnowledgeController
from chatbox.web.knowledge_pages import KnowledgePagesController
from chatbox.web.library import LibraryController
from chatbox.web.login import LoginController
from chatbox.web.openai_api import OpenAIController
from chatbox.web.pages import PagesController

ROUTE_HANDLERS: list[ControllerRouterHandler] = [
    ConversationController,
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
]
