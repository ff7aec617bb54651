"""A generation whose usage is charged to its admission ticket when it ends."""

from __future__ import annotations

from collections.abc import AsyncIterator

from chatbox.chat.admission import Ticket
from chatbox.engine.types import DoneEvent, EngineEvent, Generation, TokenEvent


class MeteredGeneration:
    """Wraps an engine generation: the ticket is settled on its last event or on cancel."""

    def __init__(self, inner: Generation, ticket: Ticket) -> None:
        self.inner = inner
        self.ticket = ticket

    def __aiter__(self) -> AsyncIterator[EngineEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[EngineEvent]:
        async for event in self.inner:
            if isinstance(event, TokenEvent):
                self.ticket.mark_started()
            elif isinstance(event, DoneEvent):
                if event.finish_reason == "error":
                    self.ticket.outcome = "error"
                await self.ticket.finish(event.usage)
            yield event

    def cancel(self) -> None:
        self.inner.cancel()
        if not self.ticket.done:
            # The engine still reports what the cancelled request used: charge that.
            self.ticket.gatekeeper.spawn(self._settle())

    async def _settle(self) -> None:
        usage = None
        async for event in self.inner:  # what is left; a cancelled request ends with Done
            if isinstance(event, DoneEvent):
                usage = event.usage
        await self.ticket.finish(usage)
