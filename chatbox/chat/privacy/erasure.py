"""Erasing conversations from the chat side: stop their answers, erase the rows, drop KV."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from chatbox.chat.models import ModelProvider
from chatbox.chat.running.runs import TurnRun
from chatbox.store import Store
from chatbox.store.erasure import Erased, ErasureRepo

log = logging.getLogger("chatbox.chat")
STOP_WAIT_S = 5.0  # a cancelled answer ends within a decode step; this is a generous cap


async def stop_runs(runs: dict[str, TurnRun], conv_ids: Sequence[str]) -> None:
    """Cancel the running answers of these conversations and wait until they are written,
    so that no late turn lands after the erasure (the store refuses one anyway)."""
    waiting = [c for c in conv_ids if c in runs]
    for conv_id in waiting:
        runs[conv_id].on_abandon()
    deadline = asyncio.get_running_loop().time() + STOP_WAIT_S
    while any(c in runs for c in waiting) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)


async def forget_kv(models: ModelProvider, conv_ids: Sequence[str]) -> None:
    """Drop the conversations' cached and parked KV from every loaded engine."""
    for name in models.names():
        if not models.holds_kv(name):  # not loaded: it holds nothing
            continue
        engine = await models.engine(name)
        # A local engine's async `forget` drops live, RAM and disk KV (its own model's files
        # and those of models not loaded now); a remote one's `forget_many` sends one call
        # to each replica of the model, waiting a short while only (see `cluster.erasure`).
        many = getattr(engine, "forget_many", None)
        if many is not None:
            try:
                await many(conv_ids)
            except Exception:  # erasure of the rows must not fail on a cache
                log.exception("could not drop the KV of %d conversations", len(conv_ids))
            continue
        forget = getattr(engine, "forget", None)
        if forget is None:
            continue
        for conv_id in conv_ids:
            try:
                await forget(conv_id)
            except Exception:  # erasure of the rows must not fail on a cache
                log.exception("could not drop the KV of %s from %s", conv_id, name)


async def forget_scope_kv(models: ModelProvider, scope: str) -> None:
    """Drop every cached and parked KV of a scope (an erased account) from every loaded
    engine: its stateless completions' KV is keyed by hashes only the engine holds."""
    for name in models.names():
        if not models.holds_kv(name):
            continue
        forget = getattr(await models.engine(name), "forget_scope", None)
        if forget is None:
            continue
        try:
            await forget(scope)
        except Exception:  # erasure of the rows must not fail on a cache
            log.exception("could not drop the KV of an erased account from %s", name)


async def erase_conversations(
    store: Store,
    models: ModelProvider,
    runs: dict[str, TurnRun],
    user_id: str,
    conv_ids: Sequence[str],
    now: float | None = None,
) -> Erased:
    """Erase these conversations of the user: content, derived rows, vectors and KV."""
    await stop_runs(runs, conv_ids)
    erased = await ErasureRepo(store.db).conversations(user_id, conv_ids, now)
    await forget_kv(models, conv_ids)
    return erased


class ErasureWatch:
    """Erasures made by any process (the CLI's retention run, another front) reach what this
    process holds in RAM: the erasure journal (`ErasureRepo.journal`) is read every
    `every_s` seconds, and before an answer is served from a cache (`catch_up`)."""

    def __init__(
        self,
        store: Store,
        forget: Callable[[Sequence[str], Sequence[str]], Awaitable[None]],
        every_s: float = 1.0,
    ) -> None:
        self.repo = ErasureRepo(store.db)
        self.forget = forget  # (conversation ids, account ids): drop them from RAM
        self.every_s = every_s
        self.seen = 0  # the last journal entry applied
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """From the journal's end: caches start empty, nothing before now is in them."""
        self.seen = await self.repo.journal_end()

    async def catch_up(self) -> None:
        """Apply every erasure journaled since the last look."""
        async with self._lock:
            entries = await self.repo.journal(self.seen)
            if not entries:
                return
            conversations = [e.subject for e in entries if e.kind == "conversation"]
            accounts = [e.subject for e in entries if e.kind == "account"]
            await self.forget(conversations, accounts)
            self.seen = entries[-1].seq

    async def run(self) -> None:
        """Read the journal until cancelled (a store that is down is tried again later)."""
        while True:
            await asyncio.sleep(self.every_s)
            try:
                await self.catch_up()
            except Exception as exc:  # the database may be restarting: the next look retries
                log.debug("erasure journal not read: %s", exc)
