"""Shadow traffic gives way to users: a user's request arriving while a shadow runs cancels
it at once, a shadow never starts while a user's request is in the HTTP layer or admitted,
and no comparison is kept of a shadow that overlapped a user's request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from chatbox.accounts.audit import SYSTEM, AuditLog
from chatbox.chat.policy import Policy, default_policy_path
from chatbox.chat.rollout.shadow import Intake, Served, ShadowTraffic
from chatbox.engine.types import (
    ChatMessage,
    DoneEvent,
    EngineEvent,
    EngineStats,
    GenerationRequest,
    TokenEvent,
    Usage,
)
from chatbox.store import Store


class SlowGeneration:
    """A candidate's answer: one token every `every_s`, until cancelled."""

    def __init__(self, tokens: int, every_s: float) -> None:
        self.tokens, self.every_s = tokens, every_s
        self.cancelled = asyncio.Event()

    def cancel(self) -> None:
        self.cancelled.set()

    def __aiter__(self) -> AsyncIterator[EngineEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[EngineEvent]:
        for i in range(self.tokens):
            try:
                await asyncio.wait_for(self.cancelled.wait(), self.every_s)
            except TimeoutError:
                yield TokenEvent(f" w{i}")
            else:
                yield DoneEvent("cancelled", Usage(3, i))
                return
        yield DoneEvent("stop", Usage(3, self.tokens))


class Candidate:
    """The candidate model's engine: records what it was asked."""

    def __init__(self, tokens: int, every_s: float) -> None:
        self.tokens, self.every_s = tokens, every_s
        self.requests: list[GenerationRequest] = []
        self.generations: list[SlowGeneration] = []

    def submit(self, request: GenerationRequest) -> SlowGeneration:
        self.requests.append(request)
        self.generations.append(SlowGeneration(self.tokens, self.every_s))
        return self.generations[-1]


class Models:
    def __init__(self, candidate: Candidate) -> None:
        self.candidate = candidate

    def names(self) -> list[str]:
        return ["tiny", "cand"]

    def default(self) -> str:
        return "tiny"

    async def engine(self, name: str) -> Any:
        return self.candidate

    def stats(self, name: str) -> EngineStats | None:
        return None


@pytest.fixture
async def store(database: Path | str) -> Any:
    s = await Store.open(database)
    yield s
    await s.close()


async def traffic(store: Store, candidate: Candidate, waiting: list[int]) -> ShadowTraffic:
    policy = Policy.load(default_policy_path())
    shadow = ShadowTraffic(
        store,
        policy,
        Models(candidate),  # type: ignore[arg-type]
        AuditLog(store),
        dict,  # no local engine is busy: only the intake and admission say so
        waiting=lambda: waiting[0],
    )
    await shadow.start(SYSTEM, "cand", "free", 100)
    return shadow


async def served_answer(store: Store) -> Served:
    user = await store.users.create("ann", tier="free")
    question = (ChatMessage("user", "Hi"),)
    return Served(user, "tiny", question, "Hello there", False, 8, 0.1, 20.0, user.id)


async def settle(shadow: ShadowTraffic) -> None:
    await asyncio.gather(*shadow._tasks)


async def started(candidate: Candidate, count: int, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while len(candidate.generations) < count:
            await asyncio.sleep(0.01)


async def test_a_user_request_arriving_cancels_the_running_shadow(store: Store) -> None:
    candidate = Candidate(tokens=200, every_s=0.05)
    shadow = await traffic(store, candidate, [0])
    await shadow.offer(await served_answer(store))
    await started(candidate, 1)
    await asyncio.sleep(0.12)  # a few of its tokens are out
    shadow.intake.enter()  # a user's request reaches the front
    # Cancelled at once, not at the next look at the engines.
    assert candidate.generations[0].cancelled.is_set()
    shadow.intake.leave()
    await settle(shadow)
    status = shadow.status()
    assert status["recent"] == []
    assert {o["outcome"]: o["count"] for o in status["outcomes"]} == {"shed": 1}
    # It was sent as work no user waits on: out of the engine's latency metrics.
    assert [r.metered for r in candidate.requests] == [False]


async def test_no_compared_shadow_overlapped_a_user_request(store: Store) -> None:
    candidate = Candidate(tokens=6, every_s=0.02)
    shadow = await traffic(store, candidate, [0])
    user = await served_answer(store)
    overlapped: list[bool] = []
    for i in range(6):
        arrivals = shadow.intake.arrivals
        await shadow.offer(user)
        if i % 2:  # every other shadow has a user's request come and go while it runs
            await started(candidate, i + 1)
            shadow.intake.enter()
            shadow.intake.leave()
        await settle(shadow)
        overlapped.append(shadow.intake.arrivals != arrivals)
    compared = len(shadow.status()["recent"])
    assert compared == overlapped.count(False) == 3


async def test_a_shadow_waits_while_a_user_request_is_in_the_front_or_admitted(
    store: Store,
) -> None:
    candidate = Candidate(tokens=3, every_s=0.01)
    waiting = [0]
    shadow = await traffic(store, candidate, waiting)
    user = await served_answer(store)

    shadow.intake.enter()  # the served answer's own response is still being sent
    await shadow.offer(user)
    await asyncio.sleep(0.3)
    assert candidate.generations == []
    shadow.intake.leave()
    await settle(shadow)
    assert len(shadow.status()["recent"]) == 1

    waiting[0] = 1  # admitted, its first token not yet come
    await shadow.offer(user)
    await asyncio.sleep(0.3)
    assert len(candidate.generations) == 1
    waiting[0] = 0
    await settle(shadow)
    assert len(shadow.status()["recent"]) == 2


def test_the_intake_tells_its_listeners_of_each_arrival() -> None:
    intake, heard = Intake(), []
    intake.listeners.append(lambda: heard.append(intake.open))
    intake.enter()
    intake.enter()
    intake.leave()
    assert (heard, intake.open, intake.arrivals) == ([1, 2], 1, 2)
