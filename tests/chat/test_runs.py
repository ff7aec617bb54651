"""A running answer: numbered events, replay from an id, and abandoning after the grace."""

from __future__ import annotations

import asyncio

from chatbox.chat.running.runs import RunEvent, TurnRun


def make_run(grace_s: float = 0.05) -> tuple[TurnRun, list[str]]:
    abandoned: list[str] = []
    run = TurnRun(
        "c1", "t2", "t1", "tiny", "t1", grace_s, on_abandon=lambda: abandoned.append("abandoned")
    )
    return run, abandoned


async def drain(run: TurnRun, after: int = 0) -> list[RunEvent]:
    return [e async for e in run.follow(after)]


async def test_events_are_numbered_from_one_and_tokens_build_the_text() -> None:
    run, _ = make_run()
    first = run.publish("token", {"text": "Hel"})
    run.publish("queued", {"position": 2})
    run.publish("token", {"text": "lo"})
    assert first == RunEvent(1, "token", {"text": "Hel"})
    assert [e.id for e in run.events] == [1, 2, 3]
    assert run.text == "Hello" and not run.finished
    run.publish("done", {"status": "complete"})
    assert run.finished and run.events[-1].terminal


async def test_an_error_event_also_ends_the_run() -> None:
    run, _ = make_run()
    run.publish("error", {"message": "boom"})
    assert run.finished
    assert [e.kind for e in await drain(run)] == ["error"]


async def test_follow_replays_after_an_id_then_streams_until_the_end() -> None:
    run, _ = make_run()
    for text in "abc":
        run.publish("token", {"text": text})
    seen: list[RunEvent] = []

    async def reader() -> None:
        async for event in run.follow(after=2):
            seen.append(event)

    task = asyncio.create_task(reader())
    await asyncio.sleep(0)
    assert [e.id for e in seen] == [3]  # replayed: only what came after id 2
    run.publish("token", {"text": "d"})
    run.publish("done", {})
    await asyncio.wait_for(task, 1)
    assert [(e.id, e.kind) for e in seen] == [(3, "token"), (4, "token"), (5, "done")]


async def test_several_followers_each_get_every_event() -> None:
    run, _ = make_run()
    readers = [asyncio.create_task(drain(run)) for _ in range(3)]
    await asyncio.sleep(0)
    run.publish("token", {"text": "x"})
    run.publish("done", {})
    results = await asyncio.wait_for(asyncio.gather(*readers), 1)
    assert all([e.id for e in r] == [1, 2] for r in results)


async def test_a_late_reader_of_a_finished_run_gets_the_rest_and_returns() -> None:
    run, _ = make_run()
    run.publish("token", {"text": "x"})
    run.publish("done", {})
    assert [e.id for e in await asyncio.wait_for(drain(run), 1)] == [1, 2]
    assert await asyncio.wait_for(drain(run, after=2), 1) == []
    assert await asyncio.wait_for(drain(run, after=-5), 1) == run.events


async def test_the_last_reader_leaving_abandons_the_run_after_the_grace() -> None:
    run, abandoned = make_run(grace_s=0.05)
    run.publish("token", {"text": "x"})
    stream = run.follow()
    await anext(stream)
    await stream.aclose()  # the client went away
    await asyncio.sleep(0.01)
    assert abandoned == []  # still within the grace
    await asyncio.sleep(0.1)
    assert abandoned == ["abandoned"]


async def test_reconnecting_within_the_grace_keeps_the_run() -> None:
    run, abandoned = make_run(grace_s=0.05)
    run.publish("token", {"text": "x"})
    stream = run.follow()
    await anext(stream)
    await stream.aclose()
    again = run.follow(after=1)  # the client reconnects with Last-Event-ID: 1
    waiting = asyncio.create_task(anext(again))
    await asyncio.sleep(0.1)
    assert abandoned == []
    run.publish("done", {})
    assert (await asyncio.wait_for(waiting, 1)).kind == "done"
    await again.aclose()
    await asyncio.sleep(0.1)
    assert abandoned == []


async def test_a_finished_run_is_never_abandoned() -> None:
    run, abandoned = make_run(grace_s=0.01)
    run.publish("done", {})
    await drain(run)
    await asyncio.sleep(0.05)
    assert abandoned == []
