"""Admin views: usage per user and model (no conversation content), as JSON and a page."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Response, get
from litestar.exceptions import PermissionDeniedException
from msgspec import Struct, convert

from chatbox.accounts import User
from chatbox.accounts.usage import month_start
from chatbox.web.auth import AnyRequest
from chatbox.web.deps import AccountsDep, ServicesDep, UserDep
from chatbox.web.ui.helpers import UI_EXCEPTION_HANDLERS, html


class UsageReportOut(Struct, forbid_unknown_fields=True):
    """Requests and tokens per user, model, day and arm (`data`), and per user (`users`)."""

    since: str | None
    data: list[dict[str, Any]]
    users: list[dict[str, Any]]


class MemoryRowOut(Struct, forbid_unknown_fields=True):
    what: str
    bytes: int


class ServerMemoryOut(Struct, forbid_unknown_fields=True):
    """Where the server's resident memory goes, row by row, beside its RSS."""

    pid: int
    malloc_arenas: int  # glibc's arenas in use (CHATBOX_MALLOC_ARENAS caps them)
    rss_bytes: int
    total_bytes: int  # the rows' sum, measured apart from RSS
    other_bytes: int  # RSS the rows did not account for
    rows: list[MemoryRowOut]
    models: list[str]  # loaded now


def require_admin(user: User) -> None:
    if user.role != "admin":
        raise PermissionDeniedException("only admins can see usage")


class AdminApiController(Controller):
    path = "/v1/admin"
    tags = ["admin"]

    @get("/usage")
    async def usage(
        self,
        accounts: AccountsDep,
        user: UserDep,
        since: str | None = None,
        name: str | None = None,
    ) -> UsageReportOut:
        """Usage per user, model, day and experiment arm (admins only)."""
        require_admin(user)
        return convert(await accounts.usage(since, name), UsageReportOut)

    @get("/memory")
    async def memory(self, services: ServicesDep, user: UserDep) -> ServerMemoryOut:
        """Where the server's resident memory goes, row by row, beside its RSS (admins only)."""
        if user.role != "admin":
            raise PermissionDeniedException("only admins can see the server's memory")
        return convert(await services.memory(), ServerMemoryOut)


class AdminPagesController(Controller):
    include_in_schema = False
    exception_handlers = UI_EXCEPTION_HANDLERS

    @get("/admin/usage", name="admin_usage")
    async def usage_page(
        self, request: AnyRequest, accounts: AccountsDep, user: UserDep, since: str | None = None
    ) -> Response[str]:
        require_admin(user)
        since = since or month_start()
        report = await accounts.usage(since, None)
        return html(request, "admin_usage.html", report=report, since=since)
