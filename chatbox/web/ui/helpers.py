"""Helpers of the HTML UI: rendering partials, friendly errors, the streaming bubble's SSE."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from html import escape as html_escape
from typing import Any
from urllib.parse import urlsplit

from jinja2 import Environment
from litestar import MediaType, Request, Response
from litestar.enums import RequestEncodingType
from litestar.exceptions import HTTPException, ValidationException
from litestar.params import Body
from litestar.response import Stream
from litestar.types import ExceptionHandlersMap

from chatbox.accounts import User
from chatbox.chat import (
    Busy,
    ChatError,
    ChatService,
    Conversation,
    ConversationView,
    InvalidInput,
    NotFound,
    Overloaded,
    RateLimited,
    Refused,
    RunEvent,
    TooLong,
    TurnRun,
    TurnView,
    UnknownModel,
)
from chatbox.knowledge import (
    EmbeddingUnavailable,
    Knowledge,
    KnowledgeError,
    NotFoundError,
    RejectedFile,
)
from chatbox.web.errors import STORE_UNAVAILABLE, classify
from chatbox.web.sse import SSE_HEADERS, frame, with_heartbeats
from chatbox.web.ui.render import render_markdown
from chatbox.web.ui.tool_steps import steps_from_data, steps_html, tools_before
from chatbox.web.urls import reverse

# The body marker of every HTML form post.
FORM = Body(media_type=RequestEncodingType.URL_ENCODED)

AnyRequest = Request[Any, Any, Any]


def env(request: AnyRequest) -> Environment:
    """The app's Jinja environment (configured once, by chatbox.web.ui.templating)."""
    return request.app.template_engine.engine  # type: ignore[union-attr,no-any-return]


def render(request: AnyRequest, template: str, /, **context: Any) -> str:
    """A template rendered to a string (context names may be anything, even `request`)."""
    context.setdefault("request", request)
    return env(request).get_template(template).render(**context)


def html(
    request: AnyRequest,
    template: str,
    status_code: int = 200,
    headers: dict[str, str] | None = None,
    /,
    **context: Any,
) -> Response[str]:
    """An HTML response of a template; context names may be anything (positional-only args)."""
    return Response(
        render(request, template, **context),
        status_code=status_code,
        media_type=MediaType.HTML,
        headers=headers or {},
    )


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


async def conversation_context(
    chat: ChatService, knowledge: Knowledge, user: User, view: ConversationView
) -> dict[str, Any]:
    """chat_context plus what the answers cited and the conversation's attached documents."""
    context = chat_context(chat, view)
    answers = [tv.turn.id for tv in context["turns"] if tv.turn.role == "assistant"]
    context["cited"] = await knowledge.documents.citations(user.id, answers)
    context["documents"] = await knowledge.documents.list(user.id, view.conversation.id)
    context["authors"] = await chat.author_names(user, view)
    context["tool_offer"] = chat.tool_offer(user)
    return context


def blank(value: str | None) -> str | None:
    """A form field as typed: None when it is empty or only spaces."""
    return value.strip() or None if value is not None else None


async def start_chat(
    request: AnyRequest,
    chat: ChatService,
    knowledge: Knowledge,
    user: User,
    first: Callable[[Conversation], Awaitable[None]],
    system_prompt: str | None,
    model: str | None,
    draft: str = "",
    tools_on: bool = False,
) -> Response[str]:
    """A conversation started from the new-chat page's composer (`first` gives it its first
    content before anyone sees it; a blank field is unset), then shown in that page's place."""
    conv = await chat.start_conversation(user, first, blank(system_prompt), blank(model))
    return await new_chat_page(
        request, chat, knowledge, user, conv.id, draft=draft, tools_on=tools_on
    )


async def new_chat_page(
    request: AnyRequest,
    chat: ChatService,
    knowledge: Knowledge,
    user: User,
    conv_id: str,
    draft: str = "",
    tools_on: bool = False,
) -> Response[str]:
    """A just-started conversation replacing the new-chat page: its chat, the sidebar (out
    of band), and the address bar pointing at it; `tools_on`: its tool switch is on."""
    view = await chat.view(user, conv_id)
    side = await sidebar(chat, user)
    body = render(
        request,
        "_chat.html",
        draft=draft,
        tools_on=tools_on,
        workspaces=side["workspaces"],
        **await conversation_context(chat, knowledge, user, view),
    )
    body += render(request, "_sidebar.html", **side, conv=view.conversation, oob=True)
    return Response(
        body,
        media_type="text/html",
        headers={"HX-Push-Url": reverse(request, "conversation", conv_id=conv_id)},
    )


# -- errors ------------------------------------------------------------------------------


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def friendly_message(exc: Exception, refused: str = "Not attached") -> str:
    """A sentence a person can act on (the status comes from the one error map)."""
    if isinstance(exc, Busy):
        return (
            "Still writing the previous answer. Stop it (Esc) or wait for it to "
            "finish, then send again."
        )
    if isinstance(exc, TooLong):
        return f"That message is too long for this model: {exc}."
    if isinstance(exc, InvalidInput):
        text = "Type a message first." if "empty" in str(exc) else str(exc)
        return text[:1].upper() + text[1:]
    if isinstance(exc, RateLimited):
        reason = {
            "budget": "You have used this period's token budget.",
            "streams": "You already have the most answers running at once.",
        }.get(exc.kind, "You are sending messages faster than your plan allows.")
        return f"{reason} Please try again in {_plural(exc.retry_after, 'second')}."
    if isinstance(exc, Overloaded):
        return (
            f"The server is busy right now. Please try again in "
            f"{_plural(exc.retry_after, 'second')}."
        )
    if isinstance(exc, UnknownModel):
        return f"That model is not available. Available: {', '.join(exc.available)}."
    if isinstance(exc, NotFound):
        return "That conversation or message no longer exists."
    if isinstance(exc, NotFoundError):
        return "That conversation or document no longer exists."
    if isinstance(exc, EmbeddingUnavailable):
        return "Documents need the embedding model, which is not installed here."
    if isinstance(exc, KnowledgeError):
        text = str(exc).strip().rstrip(".") or "the file could not be read"
        if isinstance(exc, RejectedFile):
            text = f"{refused}: {text}"
        return text[:1].upper() + text[1:] + "."
    if isinstance(exc, ChatError):
        return str(exc)
    if isinstance(exc, ValidationException):
        return "That request was not understood; please reload the page."
    if isinstance(exc, HTTPException):
        text = str(exc.detail).strip()
        return text[:1].upper() + text[1:] + ("" if text.endswith((".", "?", "!")) else ".")
    return "Something went wrong on the server."


def is_support(exc: Exception) -> bool:
    """A message refused as self-harm: what answers it is support and resources."""
    return isinstance(exc, Refused) and exc.category == "self-harm"


def ui_error(request: AnyRequest, exc: Exception, refused: str = "Not attached") -> Response[str]:
    """htmx requests get an inline alert (swapped into #alerts); pages get an error page."""
    problem = classify(exc)
    status, message, headers = problem.status, friendly_message(exc, refused), problem.headers
    if problem.kind == STORE_UNAVAILABLE:
        message = problem.message
    if request.headers.get("HX-Request") == "true" and is_support(exc):
        # A person who may be at risk gets support, not an error (no red alert, no 4xx).
        headers = {"HX-Retarget": "#alerts", "HX-Reswap": "innerHTML"}
        return html(request, "_support_alert.html", 200, headers)
    if request.headers.get("HX-Request") == "true":
        # Reselect: a form that keeps only part of its page (hx-select) would drop the alert.
        retarget = {"HX-Retarget": "#alerts", "HX-Reswap": "innerHTML", "HX-Reselect": ".alert"}
        headers = {**headers, **retarget}
        return html(request, "_alert.html", status, headers, message=message, status=status)
    return html(request, "error.html", status, headers, message=message, status=status)


def ui_error_handler(request: AnyRequest, exc: Exception) -> Response[str]:
    return ui_error(request, exc)


UI_EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    cls: ui_error_handler
    for cls in (ChatError, KnowledgeError, EmbeddingUnavailable, HTTPException, Exception)
}


# -- the streaming bubble ----------------------------------------------------------------


def _text_until(run: TurnRun, event_id: int) -> str:
    """The answer's text as of event `event_id` (where a reconnecting client left off)."""
    return "".join(e.data["text"] for e in run.events[:event_id] if e.kind == "token")


def moderation_frame(event: RunEvent) -> bytes:
    """Output moderation cut the answer: the notice replaces what was shown."""
    notice = html_escape(str(event.data["message"]))
    return frame("html", f'<p class="moderation-note" role="status">{notice}</p>', event.id)


async def final_turn(
    chat: ChatService, user: User, conv_id: str, turn_id: str
) -> tuple[TurnView | None, ConversationView | None]:
    """The finished turn (with its siblings) and the conversation as it now stands."""
    try:
        view = await chat.view(user, conv_id)
    except ChatError:
        return None, None
    for tv in view.turns:
        if tv.turn.id == turn_id:
            return tv, view
    return await chat.turn_view(user, conv_id, turn_id), view


async def _final_frame(
    request: AnyRequest,
    chat: ChatService,
    knowledge: Knowledge,
    user: User,
    conv_id: str,
    turn_id: str,
    event_id: int | str,
    remembered: list[str],
) -> bytes:
    tv, view = await final_turn(chat, user, conv_id, turn_id)
    cited = await knowledge.documents.citations(user.id, [turn_id]) if tv else {}
    path = [v.turn for v in view.turns] if view else []
    at = next((i for i, t in enumerate(path) if t.id == turn_id), 0)
    body = render(
        request,
        "_done.html",
        tools=tools_before(path, at),
        memory_saved=remembered,
        tv=tv,
        view=view,
        turn_id=turn_id,
        cited=cited,
        conv=view.conversation if view else None,
        **(await sidebar(chat, user) if view else {"convs": []}),
    )
    return frame("done", body, event_id)


async def answer_frames(
    run: TurnRun,
    after: int,
    final: Callable[[RunEvent], Awaitable[bytes]],
    *,
    queue_note: bool = True,
    other: Callable[[RunEvent], object] | None = None,
) -> AsyncGenerator[bytes, None]:
    """An answer's events after `after`, framed for its bubble: `html` frames (the whole
    answer so far, rendered; a moderation notice; with `queue_note`, the place in line),
    then `final`'s frame for the terminal event. Events that make no frame go to `other`.

    Tokens that are already followed by newer ones are coalesced into one render, so a
    slow client or a reconnect gets the latest state, not a replay of every step.
    """
    text = _text_until(run, after)
    tools = [(e.kind, e.data) for e in run.events[: max(0, after)] if e.kind.startswith("tool_")]
    async with contextlib.aclosing(run.follow(after)) as events:
        async for event in events:
            if event.kind in ("tool_call", "tool_result", "tool_approval", "tool_decision"):
                tools.append((event.kind, event.data))
                steps = steps_html(steps_from_data(tools), run.conversation_id)
                yield frame("html", str(steps) + (render_markdown(text) or ""), event.id)
            elif event.kind == "token":
                text += event.data["text"]
                if event.id < len(run.events):
                    continue  # more already waiting: render once, with all of it
                steps = steps_html(steps_from_data(tools), run.conversation_id)
                yield frame("html", str(steps) + (render_markdown(text) or ""), event.id)
            elif event.kind == "moderation" and event.data.get("message"):
                text = ""
                yield moderation_frame(event)
            elif queue_note and event.kind == "queued" and not text:  # the server is busy
                position = int(event.data["position"])
                yield frame(
                    "html",
                    f'<p class="queue-note" role="status">The server is busy: '
                    f"you are number {position} in line…</p>",
                    event.id,
                )
            elif event.terminal:
                yield await final(event)
            elif other is not None:
                other(event)


async def ui_events(
    request: AnyRequest,
    chat: ChatService,
    knowledge: Knowledge,
    user: User,
    run: TurnRun,
    after: int,
) -> AsyncIterator[bytes]:
    """A stored conversation's bubble: `answer_frames`, ending in the final bubble (which
    says what the message saved to memory)."""
    # Facts the message saved to memory ("remember that …"): the final bubble says so.
    remembered = [f for e in run.events if e.kind == "memory" for f in e.data["facts"]]

    async def done(event_id: int | str) -> bytes:
        return await _final_frame(
            request,
            chat,
            knowledge,
            user,
            run.conversation_id,
            run.turn_id,
            event_id,
            remembered,
        )

    if run.finished and after >= len(run.events):  # reconnected after the end: say it again
        yield await done(run.events[-1].id)
        return

    def saw(event: RunEvent) -> None:
        if event.kind == "memory":  # a reattach may have counted it already
            remembered.extend(f for f in event.data["facts"] if f not in remembered)

    frames = answer_frames(run, after, lambda event: done(event.id), other=saw)
    async with contextlib.aclosing(frames) as chunks:
        async for chunk in chunks:
            yield chunk


async def _one(chunk: bytes) -> AsyncIterator[bytes]:
    yield chunk


async def ui_stream(
    request: AnyRequest,
    chat: ChatService,
    knowledge: Knowledge,
    user: User,
    conv_id: str,
    turn_id: str,
    after: int,
    heartbeat_s: float,
) -> Stream:
    """The SSE behind a streaming bubble; a finished or unknown answer gets its final form.

    Another user's conversation looks exactly like one that does not exist: the final
    "no longer available" frame (a 200, so the SSE client stops instead of retrying).
    """
    try:
        await chat.conversation(user, conv_id)  # scoped to the user
        run = await chat.find_run(conv_id, turn_id)
    except NotFound:
        run = None
    if run is None:
        body: AsyncIterator[bytes] = _one(
            await _final_frame(request, chat, knowledge, user, conv_id, turn_id, "final", [])
        )
    else:
        body = ui_events(request, chat, knowledge, user, run, after)
    return Stream(
        with_heartbeats(body, heartbeat_s), media_type="text/event-stream", headers=SSE_HEADERS
    )


async def sidebar(chat: ChatService, user: User) -> dict[str, Any]:
    """What the sidebar shows: the conversations, and the user's workspaces (id to name),
    which it lists and by which it marks the conversations living in one."""
    convs: list[Conversation] = await chat.conversations(user)
    return {"convs": convs, "workspaces": await chat.workspace_names(user)}


def shown_id(request: AnyRequest) -> str | None:
    """The conversation the page that sent this htmx request shows, if it shows one."""
    path = urlsplit(request.headers.get("hx-current-url", "")).path.rstrip("/")
    prefix = reverse(request, "conversation", conv_id="_").removesuffix("_")  # "/c/"
    return path.removeprefix(prefix) or None if path.startswith(prefix) else None


def viewing(request: AnyRequest, conv_id: str) -> bool:
    """Whether the page that sent this htmx request shows the conversation."""
    return shown_id(request) == conv_id
