"""Share links: the owner's API (create, list, revoke) and the public read-only page.

`/s/{token}` has no `user` parameter, so it is served without credentials: the token is
the only key (only its hash is stored). It is marked noindex (meta and header) and served
under the same CSP as every page; the text is rendered by the same `markdown` filter.
"""

from __future__ import annotations

from dataclasses import dataclass

from litestar import Controller, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT
from msgspec import Struct

from chatbox.chat.teams.shares import Sharing
from chatbox.web.api.schemas import pick
from chatbox.web.deps import UserDep
from chatbox.web.ui.helpers import UI_EXCEPTION_HANDLERS, AnyRequest, html
from chatbox.web.urls import reverse

SharingDep = NamedDependency[Sharing]
NOINDEX = {"X-Robots-Tag": "noindex, nofollow", "Cache-Control": "no-store"}


@dataclass
class NewShare:
    upto_turn_id: str | None = None  # the last turn shared (default: the active branch's last)


class ShareOut(Struct):
    id: str
    conversation_id: str
    title: str | None
    upto_turn_id: str
    turns: int
    created_at: float


class NewShareOut(ShareOut):
    """A link just made: its secret is shown this once (only its hash is kept)."""

    token: str
    url: str


class SharesOut(Struct):
    data: list[ShareOut]


class SharesController(Controller):
    """The owner's share links."""

    tags = ["sharing"]

    @post("/v1/conversations/{conv_id:str}/shares", status_code=HTTP_201_CREATED)
    async def create(
        self,
        request: AnyRequest,
        sharing: SharingDep,
        user: UserDep,
        conv_id: str,
        data: NewShare | None = None,
    ) -> NewShareOut:
        """Share the conversation up to a turn; the link (its secret) is in the answer once."""
        share, token = await sharing.share(user, conv_id, (data or NewShare()).upto_turn_id)
        url = reverse(request, "share_page", token=token)
        return pick(NewShareOut, share, token=token, url=url)

    @get("/v1/conversations/{conv_id:str}/shares", name="conversation_shares")
    async def of_conversation(self, sharing: SharingDep, user: UserDep, conv_id: str) -> SharesOut:
        """The links of one of the user's conversations."""
        return SharesOut([pick(ShareOut, s) for s in await sharing.links(user, conv_id)])

    @get("/v1/shares")
    async def mine(self, sharing: SharingDep, user: UserDep) -> SharesOut:
        """Every link the user made (also of conversations since deleted)."""
        return SharesOut([pick(ShareOut, s) for s in await sharing.links(user)])

    @delete("/v1/shares/{share_id:str}", status_code=HTTP_204_NO_CONTENT, name="share_revoke")
    async def revoke(self, sharing: SharingDep, user: UserDep, share_id: str) -> None:
        """Revoke a link: it answers 404 from now on, and its snapshot is deleted."""
        await sharing.revoke(user, share_id)


class SharePagesController(Controller):
    """The snapshot page (public) and "Continue this conversation" (logged in)."""

    include_in_schema = False
    exception_handlers = UI_EXCEPTION_HANDLERS

    @get("/s/{token:str}", name="share_page")
    async def page(self, request: AnyRequest, sharing: SharingDep, token: str) -> Response[str]:
        snap = await sharing.snapshot(token)
        return html(request, "share.html", 200, NOINDEX, snap=snap, token=token, confirm=False)

    @get("/s/{token:str}/continue", name="share_continue")
    async def confirm(
        self, request: AnyRequest, sharing: SharingDep, user: UserDep, token: str
    ) -> Response[str]:
        """Asks before copying (a link alone must never write into an account)."""
        snap = await sharing.snapshot(token)
        return html(request, "share.html", 200, NOINDEX, snap=snap, token=token, confirm=True)

    @post("/s/{token:str}/continue", status_code=200)
    async def copy(
        self, request: AnyRequest, sharing: SharingDep, user: UserDep, token: str
    ) -> Response[str]:
        conv = await sharing.continue_copy(user, token)
        target = reverse(request, "conversation", conv_id=conv.id)
        return Response("", headers={"HX-Redirect": target, "Location": target})
