"""A metered generation settles its admission ticket exactly once: at its end or on cancel."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from chatbox.chat.admission import Gatekeeper, Ticket
from chatbox.chat.policy import Policy
from chatbox.chat.routing import Router
from chatbox.chat.stateless.metered import MeteredGeneration
from chatbox.engine.types import DoneEvent, TokenEvent, Usage
from chatbox.store import User
from chatbox.store.usage import UsageRepo
from tests.chat.fakes import FakeGeneration, FakeUsage

USER = User("u1", "ann", "member", "paid", False, 0.0)
POLICY: dict[str, Any] = {"tiers": {"paid": {"rpm": 0, "tpm": 0, "max_streams": 1}}}


async def admitted() -> tuple[Gatekeeper, FakeUsage, Ticket]:
    usage = FakeUsage()
    policy = Policy.from_dict(POLICY)
    router = Router(policy, lambda: ["tiny"], lambda: "tiny")
    gate = Gatekeeper(policy, cast(UsageRepo, usage), router, lambda _name: None)
    return gate, usage, await gate.admit(USER, None, "hello")


async def settled(usage: FakeUsage) -> None:
    """Let the settle task (spawned by cancel) drain the stream and charge the ticket."""
    for _ in range(20):
        if usage.records:
            break
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)  # and give a wrong second charge the chance to show up


def charged(usage: FakeUsage) -> list[tuple[int, int]]:
    return [(r["prompt"], r["completion"]) for r in usage.records]


async def test_a_finished_stream_charges_its_usage_once() -> None:
    _, usage, ticket = await admitted()
    inner = FakeGeneration()
    inner.push("Hel", "lo", done=Usage(prompt_tokens=5, completion_tokens=2))
    metered = MeteredGeneration(inner, ticket)
    events = [e async for e in metered]
    assert [type(e) for e in events] == [TokenEvent, TokenEvent, DoneEvent]  # passed through
    assert ticket.started and ticket.done
    assert charged(usage) == [(5, 2)]
    metered.cancel()  # after the end: nothing more is charged
    await asyncio.sleep(0.01)
    assert charged(usage) == [(5, 2)]


async def test_the_ticket_starts_with_the_first_token() -> None:
    _, _, ticket = await admitted()
    inner = FakeGeneration()
    inner.push("a")
    stream = aiter(MeteredGeneration(inner, ticket))
    assert not ticket.started
    await anext(stream)
    assert ticket.started and not ticket.done


async def test_cancel_charges_what_the_cancelled_request_used() -> None:
    _, usage, ticket = await admitted()
    inner = FakeGeneration(cancel_usage=Usage(prompt_tokens=5, completion_tokens=1))
    inner.push("a")
    metered = MeteredGeneration(inner, ticket)
    stream = aiter(metered)
    await anext(stream)
    metered.cancel()
    metered.cancel()  # twice: still one charge
    assert inner.cancelled
    await stream.aclose()  # the reader goes away without the final event: read here
    await settled(usage)
    assert ticket.done and charged(usage) == [(5, 1)]


async def test_a_reader_that_cancels_mid_stream_still_gets_the_final_event() -> None:
    """The OpenAI answer cancels once a forced tool call is read, and reads on to the final
    event. Nothing else may take that event from it: a settle task reading the same queue
    took it one time in several, and the answer waited for ever."""
    for _ in range(20):
        _, usage, ticket = await admitted()
        inner = FakeGeneration(cancel_usage=Usage(prompt_tokens=5, completion_tokens=2))
        inner.push("a", "b")
        metered = MeteredGeneration(inner, ticket)
        seen = []

        async def read(m: MeteredGeneration = metered, got: list[object] = seen) -> None:
            async for event in m:
                got.append(event)
                if len(got) == 1:
                    m.cancel()  # as the answer does once its call is whole
                    await asyncio.sleep(0)  # anything else that runs now runs before it reads

        await asyncio.wait_for(read(), 5)
        assert isinstance(seen[-1], DoneEvent) and seen[-1].finish_reason == "cancelled"
        await settled(usage)
        assert charged(usage) == [(5, 2)]


async def test_cancel_before_any_event_frees_the_users_stream() -> None:
    gate, usage, ticket = await admitted()
    metered = MeteredGeneration(FakeGeneration(), ticket)
    metered.cancel()
    await settled(usage)
    assert charged(usage) == [(0, 0)]
    # max_streams is 1: the cancelled answer no longer counts against it.
    assert (await gate.admit(USER, None, "again")).model == "tiny"
