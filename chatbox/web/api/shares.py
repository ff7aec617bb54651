"""Share links: the owner's API (create, list, revoke) and the public read-only page.

`/s/{token}` has no `user` parameter, so it is served without credentials: the token is
the only key (only its hash is stored). It is marked noindex (meta and header) and served
under the same CSP as every page; the text is rendered by the same `markdown` filter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from litestar import Controller, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT

import chatbox.web.urls as urls
from chatbox.chat.shares import Share, Sharing
from chatbox.web.deps import UserDep
from chatbox.web.ui.helpers import UI_EXCEPTION_HANDLERS, AnyRequest, html

SharingDep = NamedDependency[Sharing]
NOINDEX = {"X-Robots-Tag": "noindex, nofollow", "Cache-Control": "no-store"}


@dataclass
class NewShare:
    upto_turn_id: str | None = None  # the last turn shared (default: the active branch's last)


def share_out(share: Share, token: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": share.id,
        "conversation_id": share.conversation_id,
        "title": share.title,
        "upto_turn_id": share.upto_turn_id,
        "turns": share.turns,
        "created_at": share.created_at,
    }
    if token is not None:  # shown once: only its hash is kept
        out["token"] = token
        out["url"] = urls.share_page(token)
    return out


class SharesController(Controller):
    """The owner's share links."""

    tags = ["sharing"]

    @post("/v1/conversations/{conv_id:str}/shares", status_code=HTTP_201_CREATED)
    async def create(
        self, sharing: SharingDep, user: UserDep, conv_id: str, data: NewShare | None = None
    ) -> dict[str, Any]:
        """Share the conversation up to a turn; the link (its secret) is in the answer once."""
        share, token = await sharing.share(user, conv_id, (data or NewShare()).upto_turn_id)
        return share_out(share, token)

    @get("/v1/conversations/{conv_id:str}/shares")
    async def of_conversation(
        self, sharing: SharingDep, user: UserDep, conv_id: str
    ) -> dict[str, Any]:
        """The links of one of the user's conversations."""
        return {"data": [share_out(s) for s in await sharing.links(user, conv_id)]}

    @get("/v1/shares")
    async def mine(self, sharing: SharingDep, user: UserDep) -> dict[str, Any]:
        """Every link the user made (also of conversations since deleted)."""
        return {"data": [share_out(s) for s in await sharing.links(user)]}

    @delete("/v1/shares/{share_id:str}", status_code=HTTP_204_NO_CONTENT)
    async def revoke(self, sharing: SharingDep, user: UserDep, share_id: str) -> None:
        """Revoke a link: it answers 404 from now on, and its snapshot is deleted."""
        await sharing.revoke(user, share_id)


class SharePagesController(Controller):
    """The snapshot page (public) and "Continue this conversation" (logged in)."""

    include_in_schema = False
    exception_handlers = UI_EXCEPTION_HANDLERS

    @get("/s/{token:str}")
    async def page(self, request: AnyRequest, sharing: SharingDep, token: str) -> Response[str]:
        snap = await sharing.snapshot(token)
        return html(request, "share.html", 200, NOINDEX, snap=snap, token=token, confirm=False)

    @get("/s/{token:str}/continue")
    async def confirm(
        self, request: AnyRequest, sharing: SharingDep, user: UserDep, token: str
    ) -> Response[str]:
        """Asks before copying (a link alone must never write into an account)."""
        snap = await sharing.snapshot(token)
        return html(request, "share.html", 200, NOINDEX, snap=snap, token=token, confirm=True)

    @post("/s/{token:str}/continue", status_code=200)
    async def copy(self, sharing: SharingDep, user: UserDep, token: str) -> Response[str]:
        conv = await sharing.continue_copy(user, token)
        target = urls.conversation(conv.id)
        return Response("", headers={"HX-Redirect": target, "Location": target})
