"""Request-scoped dependencies: the acting user and the app's services."""

from __future__ import annotations

from typing import Any, TypeAlias

from litestar import Request
from litestar.di import NamedDependency, Provide

from chatbox.chat import ChatService
from chatbox.store import Store, User
from chatbox.web.auth import authenticate


async def provide_user(request: Request[Any, Any, Any]) -> User:
    """The acting user: a Bearer API key or a session cookie (see chatbox.web.auth)."""
    return await authenticate(request)


async def provide_chat(request: Request[Any, Any, Any]) -> ChatService:
    chat: ChatService = request.app.state.chat
    return chat


async def provide_store(request: Request[Any, Any, Any]) -> Store:
    store: Store = request.app.state.store
    return store


DEPENDENCIES = {
    "user": Provide(provide_user),
    "chat": Provide(provide_chat),
    "store": Provide(provide_store),
}

# Annotate handler parameters with these so Litestar knows they are injected dependencies.
UserDep: TypeAlias = NamedDependency[User]
ChatDep: TypeAlias = NamedDependency[ChatService]
StoreDep: TypeAlias = NamedDependency[Store]
