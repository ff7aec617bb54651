"""Moderation in a turn: the input check (after admission, before any model work) and a
generation whose answers are watched as they stream (the OpenAI-compatible API)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

from chatbox.chat.admission import Ticket
from chatbox.chat.errors import Refused
from chatbox.chat.running.runs import TurnRun
from chatbox.chat.stateless.metered import MeteredGeneration
from chatbox.engine.types import DoneEvent, EngineEvent, FinishReason, Generation, TokenEvent, Usage
from chatbox.moderation import ModerationService, OutputWatch, Verdict
from chatbox.moderation.service import Screening
from chatbox.store import Turn, User

log = logging.getLogger("chatbox.moderation")


async def screen_input(
    moderation: ModerationService | None,
    user: User,
    text: str,
    direction: str = "input",
    unsaved: bool = False,
) -> Verdict | None:
    """The message's verdict; a block raises Refused, recording only category and scores
    (a refused message is never stored, not even for review). `unsaved`: a temporary chat's."""
    if moderation is None or not moderation.enabled or not text:
        return None
    verdict = await moderation.check(user, text, direction)
    if verdict.blocked:
        if unsaved:
            await note_unsaved(moderation, user, direction, verdict)
        else:
            await moderation.queue.record(user, direction, verdict, None)
        raise Refused(verdict.refusal(), verdict.category or "rule", verdict.scores)
    return verdict


async def screen_messages(
    moderation: ModerationService | None, user: User, texts: list[str], unsaved: bool = False
) -> Screening | None:
    """A stateless request's messages (the whole history, as an OpenAI client sends it):
    what is new and must be checked first is; a block raises Refused (category and scores
    queued). What is left, if anything, is checked beside generation (`ModeratedGeneration`
    starts it and cuts the answer if it fails)."""
    if moderation is None or not moderation.enabled or not texts:
        return None
    screening = await moderation.screen_messages(user, texts)
    verdict = screening.verdict
    if verdict.blocked:
        if unsaved:
            await note_unsaved(moderation, user, "input", verdict)
        else:
            await moderation.queue.record(user, "input", verdict, None)
        raise Refused(verdict.refusal(), verdict.category or "rule", verdict.scores)
    return screening


def moderation_event(verdict: Verdict, turn_id: str | None = None) -> dict[str, Any]:
    """The `moderation` SSE event's data."""
    return {
        "turn_id": turn_id,
        "action": verdict.action,
        "category": verdict.category,
        "categories": sorted(verdict.triggered),
        "message": verdict.notice() if verdict.blocked else None,
    }


async def note_input(
    moderation: ModerationService | None,
    user: User,
    verdict: Verdict | None,
    text: str,
    turn: Turn,
) -> None:
    """A warned or flagged message, once stored: into the queue (a warning, noted)."""
    if moderation is not None and verdict is not None and verdict.flagged:
        await moderation.queue.record(
            user, "input", verdict, text, conversation_id=turn.conversation_id, turn_id=turn.id
        )


UNSAVED = "temporary chat"  # the source of a queue item from a chat that stores nothing


async def note_unsaved(
    moderation: ModerationService | None, user: User, direction: str, verdict: Verdict | None
) -> None:
    """A warned, flagged or cut message or answer of a temporary chat (or of a request that
    stores nothing): queued with its category and scores only. Nothing of such a chat is
    written, so neither is its text for review, and there is no turn to point at."""
    if moderation is None or verdict is None or not verdict.flagged:
        return
    source = f"{UNSAVED} (rule {verdict.rule})" if verdict.rule else UNSAVED
    await moderation.queue.record(user, direction, verdict, None, source=source)


def watch_answer(
    moderation: ModerationService | None, user: User, run: TurnRun, generation: Generation
) -> OutputWatch | None:
    """A watch over a turn's answer: a block cancels generation at once and says so (SSE)."""
    if moderation is None:
        return None

    def cut(verdict: Verdict) -> None:
        generation.cancel()
        run.publish("moderation", {**moderation_event(verdict, run.turn_id), "direction": "output"})

    return moderation.watch(user, cut)


async def relay_answer(
    run: TurnRun,
    generation: Generation,
    ticket: Ticket,
    watch: OutputWatch | None,
    on_token: Callable[[], Awaitable[None]] | None = None,
) -> tuple[DoneEvent | None, str | None]:
    """Pass an answer's tokens to its run as they come, checked beside the stream (never
    before a token is shown; once cut, the rest is not shown), then the tail window. Returns
    the engine's last event (None if it never came) and why relaying failed, if it did."""
    done: DoneEvent | None = None
    try:
        async for event in generation:
            if isinstance(event, TokenEvent):
                if watch is not None and watch.blocked:
                    continue  # already cut: what is left of the stream is not shown
                ticket.mark_started()
                run.tokens += len(event.parts) or 1
                run.publish("token", {"text": event.text})
                if watch is not None:
                    watch.feed(event.text)
                if on_token is not None:
                    await on_token()
            elif isinstance(event, DoneEvent):
                done = event
        if watch is not None:
            await watch.finish()  # the tail window, after the last token
    except asyncio.CancelledError:
        generation.cancel()
        return done, "the server stopped while this answer was being written"
    except Exception as exc:  # one failing request must not take the service down
        generation.cancel()
        return done, f"generation failed: {exc}"
    return done, None


async def note_output(
    moderation: ModerationService | None,
    user: User,
    watch: OutputWatch | None,
    run: TurnRun,
    turn_id: str,
) -> None:
    """Queue what the watch saw on a stored answer; a warning or flag is signalled too."""
    if moderation is None or watch is None:
        return
    seen = await moderation.record_output(user, watch, run.conversation_id, turn_id)
    if seen.flagged and not seen.blocked:
        run.publish("moderation", {**moderation_event(seen, turn_id), "direction": "output"})


class ModeratedGeneration:
    """Passes tokens on at once while a watch per answer checks them; a block cancels the
    generation and ends that answer with finish reason "content_filter" (as OpenAI's API)."""

    def __init__(
        self,
        inner: Generation,
        moderation: ModerationService,
        user: User,
        rest: Callable[[], asyncio.Task[Verdict]] | None = None,
        unsaved: bool = False,
        screened: Verdict | None = None,
    ) -> None:
        """`screened`: the verdict on the messages before any model work; `rest`: starts
        the check of the request's messages left for beside generation (a
        block cuts every answer); `unsaved`: zero data retention (queue items keep no
        text)."""
        self.inner = inner
        self.moderation = moderation
        self.user = user
        self.unsaved = unsaved  # zero data retention: queue items keep no text
        self.watches: dict[int, OutputWatch] = {}
        self.rest = rest
        self.pending: asyncio.Task[Verdict] | None = None
        self.input_block: Verdict | None = None
        self.screened = screened

    def clean(self) -> bool:
        """Every check of the request and its answers ran and none warned, flagged or
        blocked: what a cached answer must be, since serving it again runs no check."""
        if self.input_block is not None or (self.screened and self.screened.flagged):
            return False
        if self.rest is not None:
            task = self.pending
            if task is None or not task.done() or task.cancelled() or task.exception():
                return False
            if task.result().flagged:
                return False
        if self.moderation.policy.output and not self.watches:
            return False  # output checks are on, yet no answer was watched
        return not any(
            w.verdict is not None or (w.mark is not None and w.mark.flagged)
            for w in self.watches.values()
        )

    def _start_rest(self) -> None:
        # At the first token, not before: on a CPU box the check would take cores from the
        # prompt's prefill, and the first token's wait is what a person feels.
        if self.rest is not None and self.pending is None:
            self.pending = self.rest()
            self.pending.add_done_callback(self._input_checked)

    def _input_checked(self, task: asyncio.Task[Verdict]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        verdict = task.result()
        if verdict.blocked and self.input_block is None:
            self.input_block = verdict
            self._stop()

    async def _input(self) -> None:
        """Wait for the rest of the messages' check (an answer never ends before it)."""
        self._start_rest()
        if self.pending is None:
            return
        try:
            await self.pending
        except asyncio.CancelledError:
            raise
        except Exception:  # a failing check must not fail the answer; it is logged
            log.exception("input moderation check beside generation failed")
        self._input_checked(self.pending)

    @property
    def ticket(self) -> Any:  # the admission ticket (route headers), where metered
        return getattr(self.inner, "ticket", None)

    @property
    def filtered(self) -> Verdict | None:
        if self.input_block is not None:
            return self.input_block
        return next((w.verdict for w in self.watches.values() if w.verdict), None)

    def _watch(self, index: int) -> OutputWatch | None:
        if index not in self.watches:
            watch = self.moderation.watch(self.user, lambda v: self._stop())
            if watch is None:
                return None
            self.watches[index] = watch
        return self.watches[index]

    def _stop(self) -> None:
        # Cancel the engine's generation itself and keep reading through the meter: it
        # still sees the final event and charges what was used (MeteredGeneration.cancel
        # would read that event on its own, leaving this reader waiting).
        if isinstance(self.inner, MeteredGeneration):
            self.inner.ticket.outcome = "filtered"  # the canary verdict's refusal rate
        inner = self.inner.inner if isinstance(self.inner, MeteredGeneration) else self.inner
        inner.cancel()

    def __aiter__(self) -> AsyncIterator[EngineEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[EngineEvent]:
        done: DoneEvent | None = None
        async for event in self.inner:
            if isinstance(event, TokenEvent):
                self._start_rest()
                if self.input_block is not None:
                    continue  # the request's messages failed: nothing more is shown
                watch = self._watch(event.index)
                if watch is None or not self.filtered:
                    if watch is not None:
                        for part in event.parts or (event,):
                            watch.feed(part.text)
                    yield event
            elif isinstance(event, DoneEvent):
                done = event
        await self._input()
        for watch in self.watches.values():
            await watch.finish()
            if self.unsaved:
                seen = watch.verdict or watch.mark
                await note_unsaved(self.moderation, self.user, "output", seen)
            else:
                await self.moderation.record_output(self.user, watch)
        if done is None:
            done = DoneEvent("error", Usage(0, 0, 0), "no result")
        elif self.filtered is not None:
            n = max(len(done.finish_reasons), 1)
            reasons: list[FinishReason] = list(done.finish_reasons or (done.finish_reason,))
            for i in range(n):
                watch = self.watches.get(i)
                if self.input_block is not None or (watch is not None and watch.blocked):
                    reasons[i] = "content_filter"
            done = replace(done, finish_reason=reasons[0], finish_reasons=tuple(reasons))
        yield done

    def cancel(self) -> None:
        for watch in self.watches.values():
            watch.cancel()
        self.rest = None  # never started now
        if self.pending is not None:
            self.pending.cancel()
        self.inner.cancel()
