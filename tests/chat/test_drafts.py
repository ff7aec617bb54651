"""Saving a running answer's draft in the background: the saver writes what changed, keeps
the answer streaming while the store is away, and stops when told, whenever that lands."""

from __future__ import annotations

import asyncio

from chatbox.chat.running.drafts import DraftSaver
from chatbox.chat.running.runs import TurnRun


def make_run() -> TurnRun:
    return TurnRun("c1", "t2", "t1", "tiny", "t1", 1.0)


async def test_the_draft_follows_the_text_and_is_not_rewritten_unchanged() -> None:
    run = make_run()
    saved: list[str] = []

    async def save(text: str) -> None:
        saved.append(text)

    saver = DraftSaver(run, save, 0.05).start()
    run.publish("token", {"text": "Hel"})
    await asyncio.sleep(0.15)
    run.publish("token", {"text": "lo"})
    await asyncio.sleep(0.15)
    await saver.stop()
    assert saved == ["Hel", "Hello"]


async def test_a_failing_store_is_tried_again_and_the_saver_still_stops() -> None:
    run = make_run()
    tries: list[str] = []

    async def save(text: str) -> None:
        tries.append(text)
        if len(tries) < 3:
            raise ConnectionRefusedError("the database is away")

    saver = DraftSaver(run, save, 0.05).start()
    run.publish("token", {"text": "kept"})
    for _ in range(100):
        if saver.saved == "kept":
            break
        await asyncio.sleep(0.02)
    assert saver.saved == "kept" and tries == ["kept"] * 3
    await saver.stop()


async def test_stopping_as_a_write_finishes_still_stops_the_saver() -> None:
    """The stop lands in the very step the write in flight completes: the saver ends (a
    cancel swallowed there left it saving forever, and its answer never ended)."""
    for spins in range(3):  # the write completes 0, 1 or 2 loop steps before the stop
        run = make_run()
        written = asyncio.Event()

        async def save(text: str, written: asyncio.Event = written) -> None:
            await written.wait()

        saver = DraftSaver(run, save, 0.05).start()
        saving = saver._task
        assert saving is not None
        run.publish("token", {"text": "hi"})
        await asyncio.sleep(0.08)  # the saver is inside save() now
        written.set()
        for _ in range(spins):
            await asyncio.sleep(0)
        stopping = asyncio.create_task(saver.stop())
        done, _ = await asyncio.wait({stopping}, timeout=2)
        assert done, f"stop() still waits, {spins} step(s) after the write"
        assert saving.done()


async def test_a_cancel_of_the_caller_during_stop_reaches_the_caller() -> None:
    run = make_run()
    release = asyncio.Event()

    async def save(text: str) -> None:
        await release.wait()

    saver = DraftSaver(run, save, 0.05).start()
    run.publish("token", {"text": "hi"})
    await asyncio.sleep(0.08)

    async def answer() -> str:
        await saver.stop()
        return "went on"

    task = asyncio.create_task(answer())
    await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2)
    assert done and task.cancelled()
