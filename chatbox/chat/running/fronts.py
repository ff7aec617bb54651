"""Running answers across fronts that share one PostgreSQL database.

An answer runs in the front that started it. Another front that is asked for it (a reconnect
with `Last-Event-ID`, a page load, a stop) keeps a mirror of it: it asks the owner, over the
database's notice channel (`chatbox.store.run_channel`), to relay the answer's events; the
owner replays them from the first, then relays each new one, and counts the mirror as a
reader, so the answer's disconnect grace holds while someone reads it on any front. A front
that dies loses its liveness lock; once it has been without it for longer than a reconnect
takes (`front_grace_s`), another front stores its unfinished answers as interrupted with the
text saved so far (as the next start does on one box), and mirrors of them end as stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Coroutine
from dataclasses import dataclass, field
from typing import Any

from chatbox.chat.running.runs import RunEvent, TurnRun
from chatbox.store import Store, Turn
from chatbox.store.run_channel import Message, RunChannel

log = logging.getLogger("chatbox.chat")
SWEEP_S = 2.0  # how often a front looks for answers of fronts that died
REPLAY_WAIT_S = 5.0  # how long a mirror waits for the owner's replay before giving up
CHECK_S = 1.0  # how often a mirror checks that its answer's front is still alive
STORED_WAIT_S = 2.0  # an answer stored without its last events relayed: wait, then read it
_FINISH_REASONS = {
    "complete": "stop",
    "stopped": "cancelled",
    "filtered": "content_filter",
    "interrupted": "error",
    "failed": "error",
}


@dataclass
class _Mirror(TurnRun):
    """Another front's answer, as relayed: `on_leave` when its last reader here is gone."""

    on_leave: Callable[[], None] = lambda: None
    replayed: asyncio.Event = field(default_factory=asyncio.Event)
    asked_at: float = 0.0  # when a replay was last asked for (events went missing)

    def _abandon(self) -> None:
        self._abandon_timer = None
        if self._followers == 0 and not self.finished:
            self.on_leave()


@dataclass
class Fronts:
    """This front's part: relays its answers to fronts that ask, mirrors theirs, and stores
    dead fronts' answers as interrupted."""

    store: Store
    channel: RunChannel
    runs: dict[str, TurnRun]  # this front's answers running now, by conversation
    finished: dict[str, TurnRun]  # this front's answers just finished, by turn id
    grace_s: float
    keep_s: float  # a finished answer's events stay replayable this long
    front_grace_s: float = 10.0  # a front without its lock this long is taken for dead
    _missing: dict[str, float] = field(default_factory=dict)  # front -> seen without its lock
    _relays: dict[tuple[str, str], asyncio.Task[None]] = field(default_factory=dict)
    _mirrors: dict[str, _Mirror] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def start(self) -> None:
        self.channel.subscribe(self._on_message)
        self._spawn(self._sweep())

    async def stop(self) -> None:
        """Relay what the last answers published (briefly), then stop every task."""
        relays = list(self._relays.values())
        if relays:
            await asyncio.wait(relays, timeout=1.0)
        self.channel.unsubscribe(self._on_message)
        tasks = [*self._relays.values(), *self._tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- answers of fronts that died -------------------------------------------------------

    async def recover(self) -> int:
        """Store every answer of a front that is gone as interrupted; how many there were."""
        drafts = await self.store.turns.draft_fronts()
        writers = {front for front in drafts.values() if front is not None}
        for front in [f for f in self._missing if f not in writers]:
            del self._missing[front]  # nothing of its left to take over
        if not drafts:
            return 0
        standing = await self._standing(writers)
        if standing is None:
            return 0
        gone = writers - standing
        if not gone:
            return 0
        recovered = await self.store.turns.recover_drafts(gone=gone)
        if recovered:
            log.warning("stored %d answer(s) of a stopped front as interrupted", recovered)
        return recovered

    async def _alive(self) -> set[str] | None:
        """The live fronts; None while this front cannot tell (its connection is away)."""
        try:
            return await self.channel.live_fronts()
        except (ConnectionError, OSError) as exc:
            log.warning("cannot tell which fronts are alive: %s", exc)
            return None

    async def _standing(self, fronts: Collection[str | None]) -> set[str] | None:
        """Of `fronts`, those still taken for alive: holding their lock, or without it for
        less than `front_grace_s` as this front has watched (a dropped connection being
        taken again); None while this front cannot tell."""
        alive = await self._alive()
        if alive is None:
            return None
        now = time.monotonic()
        standing = set(alive)
        for front in fronts:
            if front is None:
                continue
            if front in alive:
                self._missing.pop(front, None)
                continue
            # Missing since this front first saw it so, or since this front itself came
            # back: while it was away it saw nothing.
            since = max(self._missing.setdefault(front, now), self.channel.connected_since)
            if now - since < self.front_grace_s:
                standing.add(front)
        return standing

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                await self.recover()
            except Exception as exc:  # the database away for a moment: try again next time
                log.warning("could not look for a stopped front's answers: %s", exc)

    async def writing_elsewhere(self, conv_id: str) -> bool:
        """True while another live front writes an answer in this conversation."""
        found = await self.store.turns.draft_for(conv_id)
        if found is None:
            return False
        draft = await self.store.turns.draft(found[0])
        if draft is None or draft.front == self.channel.front:
            return False
        standing = await self._standing([draft.front])
        if standing is None or draft.front in standing:
            return True  # unknown counts as busy: never two answers at once
        await self.recover()
        return False

    async def cancel(self, conv_id: str) -> bool:
        """Ask the front writing this conversation's answer to stop it; False: none is."""
        found = await self.store.turns.draft_for(conv_id)
        if found is None:
            return False
        await self._send({"op": "cancel", "turn": found[0]})
        return True

    # -- the owner's side -----------------------------------------------------------------

    def _local(self, turn_id: str) -> TurnRun | None:
        for run in self.runs.values():
            if run.turn_id == turn_id:
                return run
        return self.finished.get(turn_id)

    def _on_message(self, message: Message) -> None:
        op, turn, front = message.get("op"), str(message.get("turn")), str(message.get("front"))
        if op == "follow":
            run = self._local(turn)
            if run is not None:
                self._relay(run, front)
        elif op == "unfollow":
            task = self._relays.pop((front, turn), None)
            if task is not None:
                task.cancel()
        elif op == "cancel":
            run = self._local(turn)
            if run is not None and not run.finished:
                run.on_abandon()
        elif op == "events":
            mirror = self._mirrors.get(turn)
            if mirror is not None and not _take(mirror, message.get("events") or []):
                now = time.monotonic()
                if now - mirror.asked_at >= CHECK_S:  # some went missing: replay them
                    mirror.asked_at = now
                    self._spawn(self._send({"op": "follow", "turn": turn}))

    def _relay(self, run: TurnRun, front: str) -> None:
        key = (front, run.turn_id)
        old = self._relays.pop(key, None)
        if old is not None:
            old.cancel()
        task = asyncio.create_task(self._relay_events(run))
        self._relays[key] = task

        def done(_: asyncio.Task[None]) -> None:
            if self._relays.get(key) is task:
                del self._relays[key]

        task.add_done_callback(done)

    async def _relay_events(self, run: TurnRun) -> None:
        async with contextlib.aclosing(run.batches(0)) as batches:
            async for batch in batches:
                events = [[e.id, e.kind, e.data] for e in batch]
                await self._send({"op": "events", "turn": run.turn_id, "events": events})

    async def _send(self, message: Message) -> None:
        await self.channel.send({**message, "front": self.channel.front})

    # -- another front's answer here ------------------------------------------------------

    async def run_for(self, conv_id: str, turn_id: str | None = None) -> TurnRun | None:
        """The answer another live front writes in this conversation (that one, by turn
        id), mirrored here; None when no other front writes it."""
        if turn_id is None:
            found = await self.store.turns.draft_for(conv_id)
            if found is None:
                return None
            turn_id = found[0]
        mirror = self._mirrors.get(turn_id)
        if mirror is None:
            draft = await self.store.turns.draft(turn_id)
            if draft is None or draft.conversation_id != conv_id:
                return None
            if draft.front == self.channel.front:
                return None  # this front's own, and no longer running
            standing = await self._standing([draft.front])
            if standing is None:
                return None
            if draft.front not in standing:
                await self.recover()  # its front is gone: stored now, as interrupted
                return None
            mirror = self._mirrors.get(turn_id) or self._mirror(
                conv_id, turn_id, draft.parent_id, draft.model or ""
            )
        if mirror.conversation_id != conv_id:
            return None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(REPLAY_WAIT_S):
                await mirror.replayed.wait()
        return mirror if mirror.events else None

    def _mirror(self, conv_id: str, turn_id: str, parent_id: str, model: str) -> _Mirror:
        mirror = _Mirror(conv_id, turn_id, parent_id, model, None, self.grace_s)
        self._mirrors[turn_id] = mirror
        watcher = self._spawn(self._watch(mirror))

        def stop() -> None:  # the stop button, here: the owner stops it
            self._spawn(self._send({"op": "cancel", "turn": turn_id}))

        def leave() -> None:
            self._drop(mirror)
            watcher.cancel()

        mirror.on_abandon, mirror.on_leave = stop, leave
        self._spawn(self._send({"op": "follow", "turn": turn_id}))
        return mirror

    def _drop(self, mirror: _Mirror) -> None:
        if self._mirrors.get(mirror.turn_id) is mirror:
            del self._mirrors[mirror.turn_id]
            if not mirror.finished:
                self._spawn(self._send({"op": "unfollow", "turn": mirror.turn_id}))

    async def _watch(self, mirror: _Mirror) -> None:
        """End the mirror as stored when its front dies or its last events never come;
        keep a finished one replayable for `keep_s`."""
        try:
            while not mirror.finished:
                await asyncio.sleep(CHECK_S)
                if mirror.finished:
                    break
                draft = await self.store.turns.draft(mirror.turn_id)
                if draft is not None:
                    standing = await self._standing([draft.front])
                    if standing is not None and draft.front not in standing:
                        await self.recover()
                        await self._end_as_stored(mirror)
                        if not mirror.finished:
                            return  # dropped: nothing here to resume
                    elif not mirror.events:  # the follow notice was lost: ask again
                        await self._send({"op": "follow", "turn": mirror.turn_id})
                    continue
                await asyncio.sleep(STORED_WAIT_S)  # stored: its last events may be on the way
                if not mirror.finished:
                    await self._end_as_stored(mirror)
                    if not mirror.finished:
                        return
            await asyncio.sleep(self.keep_s)
        finally:
            if self._mirrors.get(mirror.turn_id) is mirror:
                del self._mirrors[mirror.turn_id]

    async def _end_as_stored(self, mirror: _Mirror) -> None:
        """The mirror's last events, read from the stored turn (its front could not send
        them)."""
        turn = await self.store.turns.written(mirror.conversation_id, mirror.turn_id)
        if mirror.finished:
            return
        if not mirror.events:  # nothing relayed, so no event ids to go on: not resumable here
            if self._mirrors.get(mirror.turn_id) is mirror:
                del self._mirrors[mirror.turn_id]
            mirror.replayed.set()
            return
        if turn is None:  # erased meanwhile
            mirror.publish("error", {"turn_id": mirror.turn_id, "message": "the answer is gone"})
        else:
            if turn.content.startswith(mirror.text) and len(turn.content) > len(mirror.text):
                mirror.publish("token", {"text": turn.content[len(mirror.text) :]})
            mirror.publish(*_ending(turn, mirror.model))
        mirror.replayed.set()

    async def stored_end(self, conv_id: str, turn_id: str, after: int) -> TurnRun | None:
        """How another front's answer ended, read from the database, for a client that got
        its events up to `after` and could not be relayed the rest: its front is gone (the
        answer is stored as interrupted once the front has been away `front_grace_s`) or
        it was stored less than `keep_s` ago. None: no such answer, or its front is alive."""
        deadline = time.monotonic() + self.front_grace_s + SWEEP_S + CHECK_S
        while True:
            draft = await self.store.turns.draft(turn_id)
            if draft is None:
                break
            if draft.conversation_id != conv_id or draft.front == self.channel.front:
                return None
            standing = await self._standing([draft.front])
            if standing is None:
                return None
            if draft.front not in standing:
                await self.recover()
                continue
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(CHECK_S)  # away a moment: back soon, or taken for dead
        turn = await self.store.turns.written(conv_id, turn_id)
        if turn is None or turn.role != "assistant" or time.time() - turn.created_at > self.keep_s:
            return None
        run = TurnRun(conv_id, turn_id, turn.parent_id or "", turn.model or "", None, 0.0)
        # The events the client has are not replayed: the end takes the ids after them.
        run.events = [RunEvent(n, "seen", {}) for n in range(1, after + 1)]
        if after == 0 and turn.content:
            run.publish("token", {"text": turn.content})
        run.publish(*_ending(turn, run.model))
        return run


def _ending(turn: Turn, model: str) -> tuple[str, dict[str, Any]]:
    """The terminal event of a stored answer."""
    payload: dict[str, Any] = {
        "turn_id": turn.id,
        "status": turn.status,
        "model": model,
        "finish_reason": _FINISH_REASONS.get(turn.status, "error"),
        "usage": {
            "prompt_tokens": turn.prompt_tokens,
            "completion_tokens": turn.completion_tokens,
            "cached_tokens": turn.cached_tokens,
        },
    }
    if turn.status == "failed":
        return "error", {**payload, "message": turn.error or "generation failed"}
    return "done", payload


def _take(mirror: _Mirror, events: list[Any]) -> bool:
    """Relayed events, in order: one already here (a second replay) is skipped; False when
    one past the next came (those between were lost: the owner was away a moment)."""
    whole = True
    for item in events:
        try:
            event_id, kind, data = int(item[0]), str(item[1]), dict(item[2])
        except (TypeError, ValueError, IndexError):
            return whole
        if event_id == len(mirror.events) + 1 and not mirror.finished:
            mirror.publish(kind, data)
        elif event_id > len(mirror.events) + 1:
            whole = False
    if mirror.events:
        mirror.replayed.set()
    return whole
