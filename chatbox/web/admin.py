"""Admin views: usage per user and model (no conversation content), as JSON and a page."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Response, get
from litestar.exceptions import PermissionDeniedException

from chatbox.chat.usage import usage_report
from chatbox.store import User
from chatbox.store.usage import day_of
from chatbox.web.auth import AnyRequest
from chatbox.web.deps import StoreDep, UserDep
from chatbox.web.ui import UI_EXCEPTION_HANDLERS, html


def require_admin(user: User) -> None:
    if user.role != "admin":
        raise PermissionDeniedException("only admins can see usage")


class AdminApiController(Controller):
    path = "/v1/admin"
    tags = ["admin"]

    @get("/usage")
    async def usage(self, store: StoreDep, user: UserDep, since: str | None = None,
                    name: str | None = None) -> dict[str, Any]:
        """Usage per user, model, day and experiment arm (admins only)."""
        require_admin(user)
        return await usage_report(store, since, name)


class AdminPagesController(Controller):
    include_in_schema = False
    exception_handlers = UI_EXCEPTION_HANDLERS  # type: ignore[assignment]

    @get("/admin/usage")
    async def usage_page(self, request: AnyRequest, store: StoreDep, user: UserDep,
                         since: str | None = None) -> Response[str]:
        require_admin(user)
        since = since or day_of()[:8] + "01"
        report = await usage_report(store, since, None)
        return html(request, "admin_usage.html", report=report, since=since)
