"""Output moderation beside a stream: overlapping windows of the answer are checked while it
is generated; nothing here ever waits before a token is passed on."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from chatbox.moderation.checker import Verdict
from chatbox.moderation.policy import severity

log = logging.getLogger("chatbox.moderation")


class OutputWatch:
    """Feed it each token as it is sent; checks run as tasks on windows of `window` tokens,
    one every `stride` tokens (so windows overlap). A block calls `on_block` at once."""

    def __init__(
        self,
        check: Callable[[str], Awaitable[Verdict]],
        window: int = 64,
        stride: int = 32,
        on_block: Callable[[Verdict], None] = lambda v: None,
    ) -> None:
        self.check = check
        self.window = window
        self.stride = stride
        self.on_block = on_block
        self.tokens: list[str] = []
        self.checked_to = 0  # the end (in tokens) of the last window sent for checking
        self.verdict: Verdict | None = None  # the block, once one window crossed the line
        self.mark: Verdict | None = None  # the strongest warn/flag seen
        self.cut_at: int | None = None  # characters of the answer before the blocked window
        self.windows = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def blocked(self) -> bool:
        return self.verdict is not None

    @property
    def text(self) -> str:
        return "".join(self.tokens)

    def feed(self, token: str) -> None:
        if self.blocked:
            return
        self.tokens.append(token)
        if len(self.tokens) - self.checked_to >= self.stride and self._idle():
            self._schedule()

    def _idle(self) -> bool:
        return self._task is None or self._task.done()

    def _schedule(self) -> None:
        end = len(self.tokens)
        # Normally the newest `window` tokens; a check that lagged behind still covers
        # everything since the last window (with the same overlap).
        start = max(0, min(end - self.window, self.checked_to - (self.window - self.stride)))
        self.checked_to = end
        chars = sum(len(t) for t in self.tokens[:start])
        self.windows += 1
        self._task = asyncio.create_task(self._run("".join(self.tokens[start:end]), chars))

    async def _run(self, text: str, chars: int) -> None:
        try:
            verdict = await self.check(text)
        except Exception:  # a failing check must not fail the answer; it is logged
            log.exception("output moderation check failed")
            return
        if verdict.blocked and self.verdict is None:
            self.verdict, self.cut_at = verdict, chars
            self.on_block(verdict)
            return
        if verdict.flagged and (
            self.mark is None or severity(verdict.action) > severity(self.mark.action)
        ):
            self.mark = verdict
        if len(self.tokens) - self.checked_to >= self.stride:
            self._schedule()  # tokens came while this ran: check them now

    async def finish(self) -> Verdict | None:
        """After the last token: wait for the checks in flight, check the tail; the block."""
        while self._task is not None and not self._task.done():
            with contextlib.suppress(Exception):
                await self._task
        if not self.blocked and len(self.tokens) > self.checked_to:
            self._schedule()
            with contextlib.suppress(Exception):
                await self._task  # type: ignore[misc]
        return self.verdict

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
