"""Temporary chats (zero-data-retention): answers stream and usage is counted, but nothing
else is written. The messages live in this process's RAM until the chat is deleted or has
been idle `idle_s`; the engine is told not to park the KV on disk (`persist=False`).

Moderation is the same as in a stored chat (the message checked before any model work, the
answer watched beside the stream and cut on a block); what it warns about, flags or blocks
goes to the review queue with its category and scores only, never the text."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace

from chatbox.chat.admission import Gatekeeper, Ticket
from chatbox.chat.errors import Busy, InvalidInput, NotFound, TooLong
from chatbox.chat.models import ModelProvider
from chatbox.chat.moderated import (
    moderation_event,
    note_unsaved,
    relay_answer,
    screen_input,
    watch_answer,
)
from chatbox.chat.options import TurnOptions
from chatbox.chat.policy import Policy
from chatbox.chat.prompt import fit_history
from chatbox.chat.running.runs import TurnRun, drive
from chatbox.chat.stateless.completions import check_fits, submit
from chatbox.chat.views import ModerationMark, run_marks
from chatbox.engine.types import ChatMessage, Generation, GenerationRequest
from chatbox.moderation import ModerationService
from chatbox.settings import Settings
from chatbox.store import Store, User
from chatbox.store.transfer import TransferRepo

PREFIX = "tmp_"  # temporary chats' ids; stored conversations' ids start with "c_"


def is_temporary(conv_id: str) -> bool:
    return conv_id.startswith(PREFIX)


@dataclass(frozen=True)
class Asked:
    """What the request in hand asks of retention: its header, and the API key it came with."""

    keep_nothing: bool = False
    api_key: str | None = None


# Set once per request (a task of its own) by the web layer, before any handler runs.
_ASKED: ContextVar[Asked] = ContextVar("chatbox_retention_asked")
_NOTHING_ASKED = Asked()


def ask(keep_nothing: bool, api_key: str | None) -> None:
    """Record what the current request asks of retention, for `keeps_nothing` to read."""
    _ASKED.set(Asked(keep_nothing, api_key))


async def keeps_nothing(store: Store, policy: Policy, user: User) -> bool:
    """Zero-data-retention for what this request does: asked for by the request (header or
    API key), or set for the user's tier or the user. Every path that stores asks this."""
    asked = _ASKED.get(_NOTHING_ASKED)
    if asked.keep_nothing or policy.tier(user.tier).zero_retention:
        return True
    return await TransferRepo(store.db).zero_retention(user.id, asked.api_key)


def refuse_storing() -> InvalidInput:
    return InvalidInput(
        "your account stores no conversations (zero-data-retention): use a temporary chat",
        "temporary",
    )


@dataclass
class TemporaryChat:
    id: str
    user_id: str
    system_prompt: str | None
    model: str | None
    created_at: float
    touched: float
    messages: list[ChatMessage] = field(default_factory=list)
    marks: dict[int, ModerationMark] = field(default_factory=dict)  # by message index
    run: TurnRun | None = None


class TemporaryChats:
    """Each user's temporary chats, in RAM only."""

    def __init__(
        self,
        models: ModelProvider,
        gate: Gatekeeper,
        settings: Settings,
        idle_s: float,
        moderation: ModerationService | None = None,
    ) -> None:
        self.models = models
        self.gate = gate
        self.settings = settings
        self.idle_s = idle_s
        self.moderation = moderation
        self._chats: dict[str, TemporaryChat] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def create(
        self, user: User, system_prompt: str | None = None, model: str | None = None
    ) -> TemporaryChat:
        self._expire()
        now = time.time()
        chat = TemporaryChat(
            PREFIX + secrets.token_hex(10), user.id, system_prompt, model, now, now
        )
        self._chats[chat.id] = chat
        return chat

    def get(self, user: User, chat_id: str) -> TemporaryChat:
        """The user's temporary chat (anyone else's, or an expired one, is not found)."""
        self._expire()
        chat = self._chats.get(chat_id)
        if chat is None or chat.user_id != user.id:
            raise NotFound("temporary chat not found (it ends after an idle hour or a restart)")
        return chat

    def cancel(self, user: User, chat_id: str) -> bool:
        """Stop the chat's running answer; False when nothing was running."""
        chat = self.get(user, chat_id)
        if chat.run is None or chat.run.finished:
            return False
        chat.run.on_abandon()
        return True

    def delete(self, user: User, chat_id: str) -> None:
        chat = self.get(user, chat_id)
        if chat.run is not None and not chat.run.finished:
            chat.run.on_abandon()
        del self._chats[chat.id]

    async def send(
        self, user: User, chat_id: str, content: str, options: TurnOptions | None = None
    ) -> TurnRun:
        """The next message of a temporary chat; the answer joins it in RAM when done."""
        chat = self.get(user, chat_id)
        if chat.run is not None and not chat.run.finished:
            raise Busy("this chat is still generating an answer; stop it or wait")
        opts = options or TurnOptions()
        if opts.model is None and chat.model:
            opts = replace(opts, model=chat.model)
        run = await self.answer(user, chat.system_prompt, chat.messages, content, opts, chat.id)
        chat.run, chat.touched = run, time.time()
        return run

    async def answer(
        self,
        user: User,
        system_prompt: str | None,
        history: Sequence[ChatMessage],
        content: str,
        options: TurnOptions,
        chat_id: str | None = None,
    ) -> TurnRun:
        """Stream an answer to `content` after `history`, storing nothing. With a chat id,
        the exchange is appended to that temporary chat once the answer is done."""
        if not content.strip():
            raise InvalidInput("the message is empty")
        if len(content) > self.settings.max_message_chars:
            raise TooLong.characters(len(content), self.settings.max_message_chars)
        ticket = await self.gate.admit(user, options.model, content, options.n)
        try:
            # After the rate limits, before any model work, as in a stored chat: a refused
            # message raises here (its queue item keeps category and scores only).
            screened = await screen_input(self.moderation, user, content, unsaved=True)
            engine = await self.models.engine(ticket.model)
            sampling = options.sampling(self.settings.max_tokens)
            limit = engine.info.n_ctx_per_seq
            budget = max(limit // 2, limit - sampling.max_tokens)
            asked = [*history, ChatMessage("user", content)]
            messages, tokens = await asyncio.to_thread(
                fit_history, system_prompt, asked, budget, engine.count_tokens
            )
            check_fits(engine, tokens)
            request = GenerationRequest(
                messages, sampling, priority=ticket.priority, cache_scope=user.id, persist=False
            )
            generation = submit(engine, request, self.gate.policy.overload.retry_after_s)
        except BaseException:
            await ticket.finish(None)
            raise
        turn_id = PREFIX + "t" + secrets.token_hex(8)
        run = TurnRun(
            chat_id or PREFIX + secrets.token_hex(10),
            turn_id,
            "",
            ticket.model,
            None,
            self.settings.disconnect_grace_s,
            on_abandon=generation.cancel,
        )
        run.publish("start", {"turn_id": turn_id, "model": ticket.model, "temporary": True})
        if screened is not None and screened.flagged:  # answered, and said so
            await note_unsaved(self.moderation, user, "input", screened)
            run.publish("moderation", {**moderation_event(screened), "direction": "input"})
        task = drive(run, self._drive(run, generation, ticket, chat_id, content))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return run

    async def _drive(
        self, run: TurnRun, generation: Generation, ticket: Ticket, chat_id: str | None, asked: str
    ) -> None:
        watch = watch_answer(self.moderation, ticket.user, run, generation)
        done, error = await relay_answer(run, generation, ticket, watch)
        await ticket.finish(done.usage if done is not None else None)
        cut = watch.verdict if watch is not None else None
        if watch is not None:
            seen = cut or watch.mark
            await note_unsaved(self.moderation, ticket.user, "output", seen)
            if seen is not None and seen.flagged and not seen.blocked:
                run.publish("moderation", {**moderation_event(seen), "direction": "output"})
        chat = self._chats.get(chat_id) if chat_id else None
        if chat is not None and done is not None and done.finish_reason != "error":
            # A cut answer is kept as its notice, as a stored chat keeps it.
            answer = cut.notice() if cut is not None else run.text
            marks = run_marks(run)
            for offset, direction in enumerate(("input", "output")):
                if direction in marks:
                    chat.marks[len(chat.messages) + offset] = marks[direction]
            chat.messages += [ChatMessage("user", asked), ChatMessage("assistant", answer)]
            chat.touched = time.time()
        usage = done.usage if done is not None else None
        payload = {
            "turn_id": run.turn_id,
            "model": run.model,
            "temporary": True,
            "finish_reason": (
                "content_filter" if cut is not None else done.finish_reason if done else "error"
            ),
            "usage": {
                "prompt_tokens": usage.prompt_tokens if usage else 0,
                "completion_tokens": usage.completion_tokens if usage else 0,
                "cached_tokens": usage.cached_tokens if usage else 0,
            },
        }
        error = error or (done.error if done is not None else "generation failed")
        if done is None or done.finish_reason == "error":
            run.publish("error", {**payload, "message": error or "generation failed"})
        else:
            run.publish("done", {**payload, "status": "filtered" if cut else "complete"})

    def _expire(self) -> None:
        cutoff = time.time() - self.idle_s
        for chat_id in [c.id for c in self._chats.values() if c.touched < cutoff]:
            chat = self._chats.pop(chat_id)
            if chat.run is not None and not chat.run.finished:
                chat.run.on_abandon()

    async def shutdown(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._chats.clear()
