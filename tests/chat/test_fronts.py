"""Two fronts' run relays on one PostgreSQL database, in one process: a mirror gets the
owner's events with the owner's ids, long events in parts, and a stop reaches the owner."""

from __future__ import annotations

import asyncio

from chatbox.chat.running.fronts import Fronts
from chatbox.chat.running.runs import TurnRun
from chatbox.store import Store
from tests.pg import PgServer


async def test_a_mirror_relays_the_owners_events_and_its_stop(postgres: PgServer) -> None:
    url = postgres.fresh_database()
    a, b = await Store.open(url), await Store.open(url)
    assert a.db.runs is not None and b.db.runs is not None
    user = await a.users.ensure_local_user()
    conv = await a.conversations.create(user.id)
    question = await a.turns.append_user(conv.id, None, "hello")
    draft = await a.turns.start_draft(conv.id, question.id, "tiny")
    stopped = asyncio.Event()
    run = TurnRun(conv.id, draft, question.id, "tiny", question.id, 5.0, on_abandon=stopped.set)
    owner = Fronts(a, a.db.runs, {conv.id: run}, {}, 5.0, 5.0)
    other = Fronts(b, b.db.runs, {}, {}, 5.0, 5.0)
    owner.start()
    other.start()
    try:
        run.publish("start", {"turn_id": draft})
        for i in range(5):
            run.publish("token", {"text": f"w{i} "})
        mirror = await other.run_for(conv.id, draft)
        assert mirror is not None and mirror.turn_id == draft
        assert [e.id for e in mirror.events] == [1, 2, 3, 4, 5, 6]
        assert mirror.text == run.text

        long = "é" * 5000  # far past a notice's 8,000 bytes: sent in parts
        run.publish("token", {"text": long})
        mirror.on_abandon()  # the stop button on the other front
        await asyncio.wait_for(stopped.wait(), 5)
        run.publish("done", {"turn_id": draft, "status": "stopped"})
        rest = [e async for e in mirror.follow(6)]
        assert [(e.id, e.kind) for e in rest] == [(7, "token"), (8, "done")]
        assert rest[0].data["text"] == long and mirror.text == run.text
        assert await other.run_for(conv.id, draft) is mirror  # replayable once finished
    finally:
        await owner.stop()
        await other.stop()
        await a.close()
        await b.close()
