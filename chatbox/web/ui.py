"""Helpers of the HTML UI: rendering partials, friendly errors, the streaming bubble's SSE."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

from jinja2 import Environment
from litestar import MediaType, Request, Response
from litestar.enums import RequestEncodingType
from litestar.exceptions import HTTPException, ValidationException
from litestar.params import Body
from litestar.response import Stream

from chatbox.chat import (
    Busy,
    ChatError,
    ChatService,
    ConversationView,
    InvalidInput,
    NotFound,
    Overloaded,
    RateLimited,
    RunEvent,
    TooLong,
    TurnRun,
    TurnView,
    UnknownModel,
)
from chatbox.store import Store, User
from chatbox.web.render import markdown, render_markdown
from chatbox.web.sse import SSE_HEADERS, frame, with_heartbeats

# The body marker of every HTML form post.
FORM = Body(media_type=RequestEncodingType.URL_ENCODED)

AnyRequest = Request[Any, Any, Any]

# The file types the attach and upload buttons offer (the ingestion decides, not this list).
UPLOAD_ACCEPT = (".txt,.text,.md,.markdown,.html,.htm,.pdf,"
                 "text/plain,text/markdown,text/html,application/pdf")


def env(request: AnyRequest) -> Environment:
    """The app's Jinja environment, with the UI's filters registered."""
    jinja: Environment = request.app.template_engine.engine  # type: ignore[union-attr]
    if "markdown" not in jinja.filters:
        jinja.filters["markdown"] = markdown
        jinja.globals["upload_accept"] = UPLOAD_ACCEPT
        jinja.trim_blocks = jinja.lstrip_blocks = True  # leaner partials and SSE frames
    return jinja


def render(request: AnyRequest, template: str, /, **context: Any) -> str:
    """A template rendered to a string (context names may be anything, even `request`)."""
    context.setdefault("request", request)
    return env(request).get_template(template).render(**context)


def html(
    request: AnyRequest, template: str, status_code: int = 200,
    headers: dict[str, str] | None = None, /, **context: Any,
) -> Response[str]:
    """An HTML response of a template; context names may be anything (positional-only args)."""
    return Response(render(request, template, **context), status_code=status_code,
                    media_type=MediaType.HTML, headers=headers or {})


def visible_turns(view: ConversationView) -> list[TurnView]:
    """The active branch; while an answer is running, only up to the turn it answers."""
    turns = view.turns
    run = view.running
    if run is not None:
        ids = [tv.turn.id for tv in turns]
        if run.parent_id in ids:
            turns = turns[: ids.index(run.parent_id) + 1]
    return turns


def chat_context(chat: ChatService, view: ConversationView) -> dict[str, Any]:
    """Everything the conversation templates need."""
    return {
        "conv": view.conversation,
        "view": view,
        "turns": visible_turns(view),
        "running": view.running,
        "models": chat.models.names(),
    }


async def conversation_context(chat: ChatService, user: User, view: ConversationView
                               ) -> dict[str, Any]:
    """chat_context plus what the answers cited and the conversation's attached documents."""
    context = chat_context(chat, view)
    answers = [tv.turn.id for tv in context["turns"] if tv.turn.role == "assistant"]
    context["cited"] = await chat.store.documents.citations(user.id, answers)
    context["documents"] = await chat.store.documents.list(user.id, view.conversation.id)
    return context


# -- errors ------------------------------------------------------------------------------

def _friendly(exc: Exception) -> tuple[int, str, dict[str, str]]:
    """Status, a message a person can act on, and headers."""
    if isinstance(exc, Busy):
        return 409, ("Still writing the previous answer. Stop it (Esc) or wait for it to "
                     "finish, then send again."), {}
    if isinstance(exc, TooLong):
        return 413, f"That message is too long for this model: {exc}.", {}
    if isinstance(exc, InvalidInput):
        text = str(exc)
        if "empty" in text:
            text = "Type a message first."
        return 422, text[:1].upper() + text[1:], {}
    if isinstance(exc, RateLimited):
        wait = exc.retry_after
        reason = {"budget": "You have used this period's token budget.",
                  "streams": "You already have the most answers running at once."}.get(
                      exc.kind, "You are sending messages faster than your plan allows.")
        return 429, (f"{reason} Please try again in {wait} second{'s' if wait != 1 else ''}."
                     ), dict(exc.headers)
    if isinstance(exc, Overloaded):
        wait = exc.retry_after
        return 503, (f"The server is busy right now. Please try again in {wait} "
                     f"second{'s' if wait != 1 else ''}."), {"Retry-After": str(wait)}
    if isinstance(exc, UnknownModel):
        return 404, f"That model is not available. Available: {', '.join(exc.available)}.", {}
    if isinstance(exc, NotFound):
        return 404, "That conversation or message no longer exists.", {}
    if isinstance(exc, ChatError):
        return 500, str(exc), {}
    if isinstance(exc, HTTPException):
        message = str(exc.detail)
        if isinstance(exc, ValidationException):
            message = "That request was not understood; please reload the page."
        return exc.status_code, message, dict(exc.headers or {})
    return 500, "Something went wrong on the server.", {}


def ui_error_handler(request: AnyRequest, exc: Exception) -> Response[str]:
    """htmx requests get an inline alert (swapped into #alerts); pages get an error page."""
    status, message, headers = _friendly(exc)
    if request.headers.get("HX-Request") == "true":
        headers = {**headers, "HX-Retarget": "#alerts", "HX-Reswap": "innerHTML"}
        return html(request, "_alert.html", status, headers, message=message, status=status)
    return html(request, "error.html", status, headers, message=message, status=status)


UI_EXCEPTION_HANDLERS = {ChatError: ui_error_handler, HTTPException: ui_error_handler}


# -- the streaming bubble ----------------------------------------------------------------

def _text_until(run: TurnRun, event_id: int) -> str:
    """The answer's text as of event `event_id` (where a reconnecting client left off)."""
    return "".join(e.data["text"] for e in run.events[:event_id] if e.kind == "token")


async def final_turn(chat: ChatService, user: User, conv_id: str, turn_id: str
                     ) -> tuple[TurnView | None, ConversationView | None]:
    """The finished turn (with its siblings) and the conversation as it now stands."""
    try:
        view = await chat.view(user, conv_id)
    except ChatError:
        return None, None
    for tv in view.turns:
        if tv.turn.id == turn_id:
            return tv, view
    turn = await chat.store.turns.get(conv_id, turn_id)
    return (TurnView(turn, [turn.id]) if turn else None), view


async def _final_frame(request: AnyRequest, chat: ChatService, user: User, conv_id: str,
                       turn_id: str, event_id: int | str) -> bytes:
    tv, view = await final_turn(chat, user, conv_id, turn_id)
    cited = await chat.store.documents.citations(user.id, [turn_id]) if tv else {}
    body = render(request, "_done.html", tv=tv, view=view, turn_id=turn_id, cited=cited,
                  conv=view.conversation if view else None,
                  convs=await chat.store.conversations.list(user.id) if view else [])
    return frame("done", body, event_id)


async def ui_events(
    request: AnyRequest, chat: ChatService, user: User, run: TurnRun, after: int
) -> AsyncIterator[bytes]:
    """`html` events (the whole answer so far, rendered) then one `done` (the final bubble).

    Tokens that are already followed by newer ones are coalesced into one render, so a
    slow client or a reconnect gets the latest state, not a replay of every step.
    """
    if run.finished and after >= len(run.events):  # reconnected after the end: say it again
        yield await _final_frame(request, chat, user, run.conversation_id, run.turn_id,
                                 run.events[-1].id)
        return
    text = _text_until(run, after)
    follow = cast(AsyncGenerator[RunEvent, None], run.follow(after))
    async with contextlib.aclosing(follow) as events:
        async for event in events:
            if event.kind == "token":
                text += event.data["text"]
                if event.id < len(run.events):
                    continue  # more already waiting: render once, with all of it
                yield frame("html", render_markdown(text) or "", event.id)
            elif event.kind == "queued" and not text:  # the server is busy: show the line
                position = int(event.data["position"])
                yield frame("html", f'<p class="queue-note" role="status">The server is busy: '
                                    f'you are number {position} in line…</p>', event.id)
            elif event.terminal:
                yield await _final_frame(request, chat, user, run.conversation_id,
                                         run.turn_id, event.id)


async def _one(chunk: bytes) -> AsyncIterator[bytes]:
    yield chunk


async def ui_stream(
    request: AnyRequest, chat: ChatService, user: User, conv_id: str, turn_id: str,
    after: int,
) -> Stream:
    """The SSE behind a streaming bubble; a finished or unknown answer gets its final form.

    Another user's conversation looks exactly like one that does not exist: the final
    "no longer available" frame (a 200, so the SSE client stops instead of retrying).
    """
    try:
        await chat.conversation(user, conv_id)  # scoped to the user
        run = chat.run_for(conv_id, turn_id)
    except NotFound:
        run = None
    if run is None:
        body: AsyncIterator[bytes] = _one(
            await _final_frame(request, chat, user, conv_id, turn_id, "final")
        )
    else:
        body = ui_events(request, chat, user, run, after)
    heartbeat = request.app.state.settings.heartbeat_s
    return Stream(with_heartbeats(body, heartbeat), media_type="text/event-stream",
                  headers=SSE_HEADERS)


async def sidebar(store: Store, user: User) -> list[Any]:
    return await store.conversations.list(user.id)
