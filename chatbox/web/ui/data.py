"""The "Your data" page (what is kept, export, import, deleting the account) and temporary
chats in the browser: pages, htmx partials and the streaming bubble's SSE."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from litestar import Controller, MediaType, Response, get, post
from litestar.response import Stream

from chatbox.accounts import User
from chatbox.chat import InvalidInput, RunEvent, TurnRun
from chatbox.chat.views import run_marks
from chatbox.data import DataService
from chatbox.web.deps import ChatDep, DataServiceDep, SettingsDep, UserDep
from chatbox.web.sse import SSE_HEADERS, LastEventId, frame, last_event_id, with_heartbeats
from chatbox.web.ui.helpers import (
    FORM,
    UI_EXCEPTION_HANDLERS,
    AnyRequest,
    answer_frames,
    html,
    render,
    sidebar,
)
from chatbox.web.uploads import read_upload
from chatbox.web.urls import reverse


@dataclass
class ConfirmForm:
    confirm: str = ""


@dataclass
class SwitchForm:
    zero_retention: str = ""  # "on" when the box is ticked


@dataclass
class TemporaryForm:
    content: str = ""


def _notice(request: AnyRequest, message: str) -> Response[str]:
    return html(request, "_alert.html", 200, None, message=message, status=200)


async def _page_context(data: DataService, user: User) -> dict[str, object]:
    return {"retention": await data.retention_settings(user)}


class DataPagesController(Controller):
    include_in_schema = False
    exception_handlers = UI_EXCEPTION_HANDLERS

    @get("/settings/data", name="data_settings")
    async def data_page(
        self, request: AnyRequest, chat: ChatDep, data_service: DataServiceDep, user: UserDep
    ) -> Response[str]:
        """Your data: what is kept and for how long, export, import, deleting the account."""
        return html(
            request,
            "data.html",
            **await sidebar(chat, user),
            conv=None,
            **await _page_context(data_service, user),
        )

    @post("/ui/settings/retention", status_code=200, name="data_retention")
    async def switch(
        self,
        request: AnyRequest,
        data_service: DataServiceDep,
        user: UserDep,
        data: Annotated[SwitchForm, FORM],
    ) -> Response[str]:
        on = data.zero_retention == "on"
        await data_service.set_zero_retention(user, on)
        return _notice(
            request,
            "From now on nothing you write is stored: every chat is temporary."
            if on
            else "Your chats are kept again, as your plan says.",
        )

    @post("/ui/settings/import", status_code=200, request_max_body_size=None, name="data_import")
    async def import_file(
        self,
        request: AnyRequest,
        chat: ChatDep,
        data_service: DataServiceDep,
        settings: SettingsDep,
        user: UserDep,
    ) -> Response[str]:
        """Import a ChatGPT export (conversations.json or its zip) or a chatbox export; the
        result says what came in and what was left out, and why."""
        form = await read_upload(request, settings.max_import_bytes)
        if form.file is None:
            raise InvalidInput("choose the conversations.json (or the zip) to import")
        done = await data_service.import_chatgpt(user, form.file.data)
        body = render(request, "_import_result.html", result=done.as_dict())
        # The sidebar lists the imported chats at once (out of band), not after a navigation.
        body += render(request, "_sidebar.html", oob=True, **await sidebar(chat, user))
        return Response(body, media_type=MediaType.HTML)

    @post("/ui/settings/delete", status_code=200, name="data_delete_account")
    async def delete_account(
        self,
        request: AnyRequest,
        data_service: DataServiceDep,
        user: UserDep,
        data: Annotated[ConfirmForm, FORM],
    ) -> Response[str]:
        """Erase one's own account once its name is typed; then back to the login page."""
        await data_service.delete_account(user, user, data.confirm.strip())
        return Response("", headers={"HX-Redirect": reverse(request, "login")})

    # -- temporary chats ------------------------------------------------------------------

    @get("/temporary", name="temporary_new")
    async def temporary_page(
        self, request: AnyRequest, chat: ChatDep, data_service: DataServiceDep, user: UserDep
    ) -> Response[str]:
        """A new temporary chat: nothing of it is stored."""
        return html(
            request,
            "temporary.html",
            **await sidebar(chat, user),
            conv=None,
            tmp=None,
            keeps=await data_service.what_is_kept(user),
        )

    @get("/temporary/{conv_id:str}", name="temporary_chat")
    async def temporary_chat(
        self,
        request: AnyRequest,
        chat: ChatDep,
        data_service: DataServiceDep,
        user: UserDep,
        conv_id: str,
    ) -> Response[str]:
        tmp = data_service.temporary.get(user, conv_id)
        return html(
            request,
            "temporary.html",
            **await sidebar(chat, user),
            conv=None,
            tmp=tmp,
            keeps=await data_service.what_is_kept(user),
        )

    @post("/ui/temporary/send", status_code=200, name="temporary_send_new")
    async def send_new(
        self,
        request: AnyRequest,
        data_service: DataServiceDep,
        user: UserDep,
        data: Annotated[TemporaryForm, FORM],
    ) -> Response[str]:
        if not data.content.strip():
            raise InvalidInput("the message is empty")
        tmp = data_service.create_temporary(user)
        return await self._sent(request, data_service, user, tmp.id, data.content, new=True)

    @post("/ui/temporary/{conv_id:str}/send", status_code=200, name="temporary_send")
    async def send(
        self,
        request: AnyRequest,
        data_service: DataServiceDep,
        user: UserDep,
        conv_id: str,
        data: Annotated[TemporaryForm, FORM],
    ) -> Response[str]:
        return await self._sent(request, data_service, user, conv_id, data.content, new=False)

    async def _sent(
        self,
        request: AnyRequest,
        data: DataService,
        user: User,
        chat_id: str,
        content: str,
        new: bool,
    ) -> Response[str]:
        run = await data.temporary.send(user, chat_id, content)
        body = render(
            request,
            "_temporary_turns.html",
            run=run,
            content=content,
            chat_id=chat_id,
            marks=run_marks(run),
        )
        headers = {}
        if new:  # the composer now sends to this chat; the address can be reloaded for an hour
            body += render(request, "_temporary_composer.html", chat_id=chat_id, oob=True)
            headers["HX-Push-Url"] = reverse(request, "temporary_chat", conv_id=chat_id)
        return Response(body, media_type="text/html", headers=headers)

    @post("/ui/temporary/{conv_id:str}/stop", status_code=204, name="temporary_stop")
    async def stop(self, data_service: DataServiceDep, user: UserDep, conv_id: str) -> None:
        data_service.temporary.cancel(user, conv_id)

    @get("/ui/temporary/{conv_id:str}/turns/{turn_id:str}/stream", name="temporary_stream")
    async def stream(
        self,
        request: AnyRequest,
        data_service: DataServiceDep,
        settings: SettingsDep,
        user: UserDep,
        conv_id: str,
        turn_id: str,
        last_id: LastEventId = None,
    ) -> Stream:
        """The streaming bubble's SSE: the answer rendered as it grows, then its final form."""
        tmp = data_service.temporary.get(user, conv_id)
        run = tmp.run if tmp.run is not None and tmp.run.turn_id == turn_id else None
        body = _events(request, run, turn_id, last_event_id(last_id))
        return Stream(
            with_heartbeats(body, settings.heartbeat_s),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )


async def _events(
    request: AnyRequest, run: TurnRun | None, turn_id: str, after: int
) -> AsyncIterator[bytes]:
    if run is None:
        yield frame("done", _done(request, None, turn_id))
        return

    async def done(event: RunEvent) -> bytes:
        return frame("done", _done(request, run, turn_id), event.id)

    frames = answer_frames(run, after, done, queue_note=False)
    async with contextlib.aclosing(frames) as chunks:
        async for chunk in chunks:
            yield chunk


def _done(request: AnyRequest, run: TurnRun | None, turn_id: str) -> str:
    """The finished answer's bubble (a cut one shows its notice; marks as in a stored chat)."""
    marks = run_marks(run) if run is not None else {}
    return render(request, "_temporary_done.html", run=run, turn_id=turn_id, marks=marks)
