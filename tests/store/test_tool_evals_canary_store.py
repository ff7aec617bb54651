"""Tool results, eval runs and canary events in the store, on SQLite and PostgreSQL alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatbox.store import Store
from chatbox.store.canaries import StartedCanary
from chatbox.store.evals import EvalResult

BOTH_STORES = True  # SQLite and PostgreSQL (tests/conftest.py)


async def test_a_tool_result_is_replaced_and_never_cached_for_an_erased_chat(
    database: Path | str,
) -> None:
    store = await Store.open(database)
    try:
        user = await store.users.ensure_local_user()
        conv = await store.conversations.create(user.id)
        await store.tool_results.put("k1", user.id, conv.id, "calc", '{"v": 1}')
        await store.tool_results.put("k1", user.id, conv.id, "calc", '{"v": 2}')
        await store.tool_results.put("k2", user.id, conv.id, "time", '{"v": 3}')
        assert await store.tool_results.get("k1", user.id) == '{"v": 2}'
        assert await store.tool_results.get("k2", user.id) == '{"v": 3}'
        assert await store.conversations.delete(user.id, conv.id)
        await store.tool_results.put("k3", user.id, conv.id, "calc", '{"v": 4}')
        assert await store.tool_results.get("k3", user.id) is None
    finally:
        await store.close()


async def test_eval_results_keep_case_order_and_canary_events_number_in_order(
    database: Path | str,
) -> None:
    store = await Store.open(database)
    try:
        cases = [
            EvalResult(c, "facts", "contains", True, 1.0, 0.1, "a", "") for c in ("z", "a", "m")
        ]
        run = await store.evals.save("m", "basic", "d", None, "admin", 1.0, cases)
        assert [r.case_id for r in await store.evals.results(run.id)] == ["z", "a", "m"]
        first = await store.canaries.add_event("arm", "free", "m", "hold", "why", "admin")
        second = await store.canaries.add_event("arm", "free", "m", "resume", "why", "admin")
        assert second.seq > first.seq
        assert (await store.canaries.states())["arm"].action == "resume"
    finally:
        await store.close()


async def test_a_started_canary_runs_afresh_until_stopped_and_runs_once(
    database: Path | str,
) -> None:
    store = await Store.open(database)
    try:
        repo = store.canaries
        await repo.add_event("live", "paid", "m2", "rollback", "an old run", "admin")
        await repo.start(StartedCanary("live", "paid", "m2", 25.0, "cli:ops", 10.0), "why")
        assert [c.arm for c in await repo.started()] == ["live"]
        assert (await repo.states())["live"].action == "resume"  # the old rollback is over
        with pytest.raises(KeyError):
            await repo.start(StartedCanary("live", "free", "m3", 5.0, "cli:ops", 11.0), "again")
        gone = await repo.stop("live", "done", "cli:ops")
        assert gone is not None and (gone.tier, gone.model, gone.percent) == ("paid", "m2", 25.0)
        assert await repo.started() == []
        assert (await repo.states())["live"].action == "rollback"
        assert await repo.stop("live", "twice", "cli:ops") is None
    finally:
        await store.close()


async def test_pins_are_set_once_and_unset_once(database: Path | str) -> None:
    store = await Store.open(database)
    try:
        assert await store.pins.pin("m2", "cli:ops")
        assert not await store.pins.pin("m2", "cli:other")
        assert [(p.model, p.actor_name) for p in await store.pins.all()] == [("m2", "cli:ops")]
        assert await store.pins.unpin("m2")
        assert not await store.pins.unpin("m2")
        assert await store.pins.all() == []
    finally:
        await store.close()


async def test_a_canary_arms_requests_do_not_teach_the_hourly_profile(
    database: Path | str,
) -> None:
    store = await Store.open(database)
    try:
        user = await store.users.ensure_local_user()
        at = 1_800_000_000.0
        await store.usage.record(user.id, "m2", prompt=3, arm="live", ts=at)
        await store.usage.record(user.id, "m1", prompt=3, ts=at)
        await store.usage.record(user.id, "m1", requests=0, shed=1, arm="live", ts=at)
        rows = await store.usage.hourly(int(at // 3600) - 1)
        assert [(r[0], r[2]) for r in rows] == [("m1", 1)]
    finally:
        await store.close()
