"""Long conversations: the oldest part of a branch is summarised ahead of need.

When what a conversation sends the model passes `settings.summary_at` of its context, the
model writes, in the background at low priority, a summary of the oldest turns (and of the
previous summary, so summaries roll). The prompt is then the system prompt with the newest
summary on the branch, plus the turns after it that fit. Until a summary is ready, turns
that do not fit are dropped, and `sent_window` says which so the UI can tell the user.

Summarising once per threshold crossing, rather than dropping one turn per message, also
keeps the cached prefix stable: the prompt's head changes once per summary, not every turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from chatbox.chat.errors import NotFound
from chatbox.chat.prompt import CountTokens, fit_history, turn_messages
from chatbox.chat.teams.access import conversation_for
from chatbox.chat.teams.workspaces import prompt_scope
from chatbox.engine.types import ChatMessage, Engine, GenerationRequest, SamplingParams, TokenEvent
from chatbox.settings import Settings
from chatbox.store import Store, Summary, Turn

log = logging.getLogger("chatbox.chat")
SUMMARY_PRIORITY = 5  # after every live answer, before memory extraction (10)
# How long a front's claim on summarising a conversation holds if it dies mid-way.
SUMMARY_HOLD_S = 600.0
SUMMARY_HEADING = "Summary of the earlier part of this conversation:"
SYSTEM = (
    "Summarise the conversation. Keep names, places, numbers, facts, decisions and open "
    "questions. A few plain sentences, no preamble."
)
EngineFor = Callable[[str], Awaitable[Engine]]


def history_budget(limit: int, max_tokens: int) -> int:
    """Prompt tokens a turn may send: the context less room for the answer (at least half)."""
    return max(limit // 2, limit - max_tokens)


def trigger_tokens(summary_at: float, limit: int, budget: int) -> int:
    """Prompt size at which summarising starts: before turns must be dropped, never after."""
    return int(min(summary_at * limit, 0.8 * budget)) if summary_at > 0 else 0


def unsummarised(path: Sequence[Turn], summary: Summary | None) -> list[Turn]:
    """The turns of the path after the ones the summary covers."""
    ids = [t.id for t in path]
    if summary is None or summary.covers_id not in ids:
        return list(path)
    return list(path[ids.index(summary.covers_id) + 1 :])


def with_summary(system_prompt: str | None, summary: Summary | None) -> str | None:
    """The system message: the conversation's system prompt, then the summary."""
    if summary is None:
        return system_prompt
    block = f"{SUMMARY_HEADING}\n{summary.content}"
    return f"{system_prompt}\n\n{block}" if system_prompt else block


def _sendable(turns: Sequence[Turn]) -> list[Turn]:
    return [t for t in turns if turn_messages([t])]  # the same rule as the prompt's


@dataclass(frozen=True)
class Window:
    """What the next turn sends of a branch (before the new message and its context)."""

    messages: tuple[ChatMessage, ...]
    tokens: int
    hidden: tuple[str, ...] = ()  # turns neither summarised nor sent: the model cannot see them


def sent_window(
    system_prompt: str | None,
    summary: Summary | None,
    path: Sequence[Turn],
    budget: int,
    count: CountTokens,
) -> Window:
    if summary is not None and all(t.id != summary.covers_id for t in path):
        summary = None  # another branch's
    turns = _sendable(unsummarised(path, summary))
    system = with_summary(system_prompt, summary)
    history = turn_messages(turns)
    if not history and not system:
        return Window((), 0)
    messages, tokens = fit_history(system, history, budget, count)
    kept = len(messages) - (1 if system else 0)
    return Window(messages, tokens, tuple(t.id for t in turns[: len(turns) - kept]))


def plan_cover(
    system_prompt: str | None,
    summary: Summary | None,
    path: Sequence[Turn],
    budget: int,
    trigger: int,
    count: CountTokens,
) -> list[Turn]:
    """The turns a new summary should cover (oldest first); empty while under the trigger.

    The newest turns within half the trigger stay word for word, starting with a user turn.
    """
    if trigger <= 0 or sent_window(system_prompt, summary, path, budget, count).tokens <= trigger:
        return []
    turns = _sendable(unsummarised(path, summary))
    kept, _ = fit_history(None, turn_messages(turns), trigger // 2, count)
    cut = len(turns) - len(kept)
    if cut < len(turns) and turns[cut].role == "assistant":
        cut += 1  # the recent part starts with the user (the only message kept was too long)
    return turns[:cut]


def summary_messages(
    previous: Summary | None, turns: Sequence[Turn], budget: int, count: CountTokens
) -> tuple[ChatMessage, ...] | None:
    """The request that summarises `turns` (after `previous`) within budget tokens, or None
    when even a clipped one cannot fit."""
    earlier = [previous.content] if previous else []
    lines = [f"{'User' if t.role == 'user' else 'Assistant'}: {t.content}" for t in turns]

    def build() -> tuple[ChatMessage, ...]:
        before = f"Summary of what came before:\n{earlier[0]}\n\n" if earlier else ""
        transcript = "\n".join(lines)
        ask = f"{before}Conversation:\n{transcript}\n\nSummarise the conversation above."
        return ChatMessage("system", SYSTEM), ChatMessage("user", ask)

    # Shorten the longest part by a third until it fits; then drop the oldest messages.
    for _ in range(200):
        messages = build()
        if count(messages) <= budget:
            return messages
        parts = [*earlier, *lines]
        longest = max(range(len(parts)), key=lambda i: len(parts[i]))
        clipped = parts[longest][: len(parts[longest]) * 2 // 3] + " …"
        if len(parts[longest]) > 40:
            if earlier and longest == 0:
                earlier[0] = clipped
            else:
                lines[longest - len(earlier)] = clipped
        elif len(lines) > 1:
            lines.pop(0)
        else:
            return None
    return None


@dataclass
class Summariser:
    """Writes summaries in the background, one conversation at a time each."""

    store: Store
    engine_for: EngineFor
    settings: Settings
    _tasks: dict[str, asyncio.Task[Summary | None]] = field(default_factory=dict)
    _again: dict[str, tuple[str, str, str]] = field(default_factory=dict)

    def busy(self, conv_id: str) -> bool:
        """A summary of this conversation is being written now."""
        return conv_id in self._tasks

    def after_turn(self, user_id: str, conv_id: str, leaf_id: str, model: str) -> None:
        """An answer was stored: summarise the branch's oldest part if it has grown enough."""
        if self.settings.summary_at <= 0:
            return
        if conv_id in self._tasks:  # look again once the running one is stored
            self._again[conv_id] = (user_id, leaf_id, model)
            return
        task = asyncio.create_task(self.summarise(user_id, conv_id, leaf_id, model))
        self._tasks[conv_id] = task
        task.add_done_callback(lambda _: self._done(conv_id))

    def _done(self, conv_id: str) -> None:
        self._tasks.pop(conv_id, None)
        again = self._again.pop(conv_id, None)
        if again is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closing
                self.after_turn(again[0], conv_id, again[1], again[2])

    async def summarise(
        self, user_id: str, conv_id: str, leaf_id: str, model: str
    ) -> Summary | None:
        """Write and store a summary of the branch ending at leaf_id, if it needs one."""
        try:
            return await self._summarise(user_id, conv_id, leaf_id, model)
        except asyncio.CancelledError:
            raise
        except Exception:  # background work: log it; the turns are dropped as before
            log.exception("summarising %s failed", conv_id)
            return None

    async def _summarise(
        self, user_id: str, conv_id: str, leaf_id: str, model: str
    ) -> Summary | None:
        job = f"summary:{conv_id}"
        if not await self.store.jobs.claim(job, SUMMARY_HOLD_S):
            return None  # another front is summarising this conversation now
        try:
            return await self._summarise_claimed(user_id, conv_id, leaf_id, model)
        finally:
            await self.store.jobs.done(job)

    async def _summarise_claimed(
        self, user_id: str, conv_id: str, leaf_id: str, model: str
    ) -> Summary | None:
        try:
            conv = await conversation_for(self.store, user_id, conv_id)
        except NotFound:  # gone, or no longer the user's to see: no summary
            return None
        engine = await self.engine_for(model)
        path = await self.store.turns.path(conv.id, leaf_id)
        ids = [t.id for t in path]
        summary = await self.store.summaries.on_path(conv.id, ids)
        limit = engine.info.n_ctx_per_seq
        budget = history_budget(limit, self.settings.max_tokens)
        trigger = trigger_tokens(self.settings.summary_at, limit, budget)
        count = engine.count_tokens
        system, _, scope = await prompt_scope(self.store, conv)
        cover = await asyncio.to_thread(plan_cover, system, summary, path, budget, trigger, count)
        if not cover:
            return None
        max_tokens = max(16, min(self.settings.summary_tokens, limit // 8))
        messages = await asyncio.to_thread(
            summary_messages, summary, cover, limit - max_tokens - 8, count
        )
        if messages is None:
            log.info("summarising %s: the context is too small for a summary request", conv_id)
            return None
        request = GenerationRequest(
            messages,
            SamplingParams(temperature=0.0, max_tokens=max_tokens, repeat_penalty=1.1),
            cache_key=None,  # never takes the conversation's cached prefix
            priority=SUMMARY_PRIORITY,
            cache_scope=scope,  # the user's (or the workspace's) private prefix cache
        )
        out = [e.text async for e in engine.submit(request) if isinstance(e, TokenEvent)]
        text = "".join(out).strip()
        if not text:
            return None
        covers = cover[-1].id
        return await self.store.summaries.add(conv.id, covers, ids.index(covers) + 1, text, model)

    async def shutdown(self) -> None:
        self._again.clear()
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)
