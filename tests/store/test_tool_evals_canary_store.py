"""Tool results, eval runs and canary events in the store, on SQLite and PostgreSQL alike."""

from __future__ import annotations

from pathlib import Path

from chatbox.store import Store
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
