"""A generation whose usage is charged to its admission ticket when it ends."""

from __future__ import annotations

from collections.abc import AsyncIterator

from chatbox.chat.admission import Ticket
from chatbox.engine.types import DoneEvent, EngineEvent, Generation, TokenEvent


class MeteredGeneration:
    """Wraps an engine generation: the ticket is settled on its last event or on cancel.

    One reader at a time takes the engine's events. A cancel while a reader is reading
    leaves the final event to that reader (it settles the ticket, or, if it stops reading
    first, reads the rest as it goes); only a cancel with no reader reads the rest itself.
    Two readers of one queue split its events, and the one that missed the final event
    waited for ever (a forced tool call's answer, cancelled once its call was read, hung
    about one time in nine under load)."""

    def __init__(self, inner: Generation, ticket: Ticket) -> None:
        self.inner = inner
        self.ticket = ticket
        self._reading = False  # a reader is iterating (it sees the final event)
        self._settling = False

    def __aiter__(self) -> AsyncIterator[EngineEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[EngineEvent]:
        self._reading = True
        try:
            async for event in self.inner:
                if isinstance(event, TokenEvent):
                    self.ticket.mark_started()
                elif isinstance(event, DoneEvent):
                    if event.finish_reason == "error":
                        self.ticket.outcome = "error"
                    await self.ticket.finish(event.usage)
                yield event
        finally:
            self._reading = False
            if not self.ticket.done:  # the reader left before the end: the rest is read here
                self.inner.cancel()
                self._settle_later()

    def cancel(self) -> None:
        self.inner.cancel()
        if not self.ticket.done and not self._reading:
            self._settle_later()

    def _settle_later(self) -> None:
        if not self._settling:
            self._settling = True
            # The engine still reports what the cancelled request used: charge that.
            self.ticket.gatekeeper.spawn(self._settle())

    async def _settle(self) -> None:
        usage = None
        async for event in self.inner:  # what is left; a cancelled request ends with Done
            if isinstance(event, DoneEvent):
                usage = event.usage
        await self.ticket.finish(usage)
