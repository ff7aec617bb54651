"""Retention with a fake clock: each tier's idle conversations are erased, exactly those;
`--dry-run` only lists them; the sweeper started with the app does it on its own."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from chatbox.accounts import AuditLog
from chatbox.chat.policy import Policy, default_policy_path
from chatbox.chat.tools.base import ToolContext
from chatbox.chat.tools.builtin import Calculator
from chatbox.chat.tools.loop import Budget, ToolSession
from chatbox.data.retention import DAY_S, Retention, keeps
from chatbox.store import Store
from chatbox.store.erasure import Erased, ErasureRepo
from chatbox.store.transfer import ConversationIn, TransferRepo, TurnIn
from tests.data.conftest import App

BOTH_STORES = True  # SQLite and PostgreSQL (tests/conftest.py)

POLICY = Policy.from_dict(
    {"tiers": {"free": {"retention_days": 30}, "paid": {}, "team": {"retention_days": 90}}}
)
T0 = 1_700_000_000.0  # "now" for the fake clock


def conv(text: str, idle_days: float) -> ConversationIn:
    at = T0 - idle_days * DAY_S
    return ConversationIn(
        text,
        None,
        at - 1,
        at,
        [TurnIn("user", text, None, at), TurnIn("assistant", "ok", 0, at)],
        1,
    )


@pytest.fixture
async def store(database: Path | str):  # type: ignore[no-untyped-def]
    s = await Store.open(database)
    yield s
    await s.close()


async def live_titles(store: Store, user_id: str) -> set[str]:
    return {c.title or "" for c in await TransferRepo(store.db).conversations(user_id)}


async def test_each_tier_keeps_its_days_by_a_fake_clock(store: Store) -> None:
    free = await store.users.create("fay", tier="free")
    paid = await store.users.create("pat", tier="paid")
    team = await store.users.create("tom", tier="team")
    odd = await store.users.create("oz", tier="gold")  # not in the policy: the free tier's rules
    transfer = TransferRepo(store.db)
    await transfer.import_conversations(free.id, [conv("fay-old", 31), conv("fay-new", 29)])
    await transfer.import_conversations(paid.id, [conv("pat-ancient", 4000)])
    await transfer.import_conversations(team.id, [conv("tom-60", 60), conv("tom-100", 100)])
    await transfer.import_conversations(odd.id, [conv("oz-40", 40)])
    old_id = next(c.id for c in await transfer.conversations(free.id) if c.title == "fay-old")
    v = np.ones(384, dtype=np.float32) / np.sqrt(384)
    await store.memories.add(free.id, "fact from the old chat", v, "extracted", old_id)
    await store.memories.add(free.id, "fact the user stated", v, "explicit")

    now = [T0]
    calls: list[tuple[str, list[str]]] = []
    erasure = ErasureRepo(store.db)

    async def erase(user_id: str, ids: Sequence[str]) -> Erased:
        calls.append((user_id, list(ids)))
        return await erasure.conversations(user_id, ids)

    retention = Retention(erasure, POLICY, erase, AuditLog(store), clock=lambda: now[0])
    dry = await retention.run(dry_run=True)
    assert sorted(e.conversation.user_name for e in dry.expired) == ["fay", "oz", "tom"]
    assert calls == [] and await live_titles(store, free.id) == {"fay-old", "fay-new"}

    report = await retention.run()
    assert report.erased.conversations == 3 and report.erased.memories == 1
    assert await live_titles(store, free.id) == {"fay-new"}
    assert await live_titles(store, paid.id) == {"pat-ancient"}  # paid keeps everything
    assert await live_titles(store, team.id) == {"tom-60"}
    assert await live_titles(store, odd.id) == set()
    assert [m.text for m in await store.memories.list(free.id)] == ["fact the user stated"]

    now[0] = T0 + 2 * DAY_S  # two days on, fay-new is 31 days idle
    assert (await retention.run()).erased.conversations == 1
    assert await live_titles(store, free.id) == set()
    assert (await retention.run()).erased.conversations == 0  # nothing twice
    # The sweeper's runs (no admin asked) are audit-logged when they erased something.
    logged = [e.detail["conversations"] for e in await store.audit.list(action="retention.run")]
    assert logged == [1, 3]


async def test_an_unfinished_deletion_is_finished(store: Store) -> None:
    user = await store.users.create("ann")
    c = await store.conversations.create(user.id, "hidden the old way")
    await store.turns.append_user(c.id, None, "words that must go")
    await store.conversations.delete(user.id, c.id)  # hidden, not erased (as before 0007)
    erasure = ErasureRepo(store.db)
    retention = Retention(erasure, POLICY, erasure.conversations, AuditLog(store))
    assert (await retention.run(dry_run=True)).unfinished == 1
    report = await retention.run()
    assert report.erased.conversations == 1 and report.erased.turns == 1
    assert await erasure.pending() == []


def test_what_a_tier_keeps_in_words() -> None:
    assert "30 days" in keeps(POLICY, "free")
    assert "until you delete" in keeps(POLICY, "paid")
    assert "until you delete" in keeps(Policy.load(default_policy_path()), "free")


def test_the_sweeper_runs_in_the_app(
    tmp_path: Path, settings, registry, embedder, database
) -> None:  # type: ignore[no-untyped-def]
    """The sweeper erases a conversation quiet for 400 days, and keeps one imported today
    whose own times are 400 days old (retention counts it from its import)."""
    from litestar.testing import TestClient

    from chatbox.app import create_app
    from tests.conftest import bearer, seed_user

    policy = tmp_path / "policy.toml"
    policy.write_text(
        default_policy_path().read_text().replace("retention_days = 0", "retention_days = 30")
    )
    url = database if isinstance(database, str) else None
    settings = settings.with_overrides(policy_path=policy, retention_sweep_s=0.2, database_url=url)
    bob = bearer(seed_user(settings, "bob", role="member", tier="free"))
    with TestClient(create_app(settings, registry), timeout=120) as c:
        app = App(c, {}, bob, settings)
        old = [
            {
                "title": "a chat from last year",
                "create_time": time.time() - 400 * DAY_S,
                "update_time": time.time() - 400 * DAY_S,
                "current_node": "b",
                "mapping": {
                    "a": {"id": "a", "message": None, "parent": None, "children": ["b"]},
                    "b": {
                        "id": "b",
                        "message": {
                            "author": {"role": "user"},
                            "content": {"content_type": "text", "parts": ["old words"]},
                        },
                        "parent": "a",
                        "children": [],
                    },
                },
            }
        ]
        body = json.dumps(old).encode()
        r = c.post("/v1/users/me/import", files={"file": ("c.json", body)}, headers=bob)
        assert r.status_code == 201, r.text
        imported = r.json()["conversation_ids"]
        fresh = c.post("/v1/conversations", json={"title": "today"}, headers=bob).json()["id"]
        bob_id = app.call(app.services.store.users.get_by_name, "bob").id
        quiet = conv("quiet for 400 days", (T0 - time.time()) / DAY_S + 400)
        transfer = TransferRepo(app.services.store.db)
        app.call(transfer.import_conversations, bob_id, [quiet])  # its own times only
        deadline = time.monotonic() + 20
        while len(c.get("/v1/conversations", headers=bob).json()["data"]) > 2:
            assert time.monotonic() < deadline, "the sweeper did not run"
            time.sleep(0.1)
        left = {x["id"] for x in c.get("/v1/conversations", headers=bob).json()["data"]}
        assert left == {fresh, *imported}
        assert "30 days" in c.get("/v1/users/me/retention", headers=bob).json()["keeps"]
        assert app.services.data is not None


async def test_an_import_counts_from_its_import_time(store: Store) -> None:
    """History imported today with year-old times is kept `retention_days` from today."""
    fay = await store.users.create("fay", tier="free")
    transfer = TransferRepo(store.db)
    await transfer.import_conversations(fay.id, [conv("from ChatGPT", 400)], imported_at=T0)
    erasure = ErasureRepo(store.db)
    now = [T0 + DAY_S]
    retention = Retention(erasure, POLICY, erasure.conversations, AuditLog(store), lambda: now[0])
    assert (await retention.run()).erased.conversations == 0
    assert await live_titles(store, fay.id) == {"from ChatGPT"}
    shown = await TransferRepo(store.db).conversations(fay.id)
    assert shown[0].updated_at == T0 - 400 * DAY_S  # its own times stay, for display
    now[0] = T0 + 31 * DAY_S
    assert (await retention.run()).erased.conversations == 1
    assert await live_titles(store, fay.id) == set()


async def test_a_pure_tools_cached_result_goes_with_its_conversation(store: Store) -> None:
    """The calculator's result is found from the user's other conversations, yet it is
    erased with the conversation whose call made it: by retention, and by a deletion."""
    fay = await store.users.create("fay", tier="free")
    transfer = TransferRepo(store.db)
    await transfer.import_conversations(fay.id, [conv("old", 31), conv("new", 1)])
    ids = {c.title: c.id for c in await transfer.conversations(fay.id)}

    async def calculate(conv_id: str) -> bool:
        context = ToolContext(fay.id, conv_id, None, time.monotonic() + 30, "free")
        session = ToolSession([Calculator()], context, Budget(4, 30.0), store.tool_results)
        step = await session.call("c1", "calculator", '{"expression": "6*7"}')
        assert step.result.text == "42"
        return step.cached

    async def cached() -> int:
        row = await store.db.fetchone("SELECT count(*) AS n FROM tool_results")
        return int(row["n"]) if row else 0

    assert not await calculate(ids["old"])
    assert await calculate(ids["new"])  # the user's other conversation finds it
    erasure = ErasureRepo(store.db)
    retention = Retention(erasure, POLICY, erasure.conversations, AuditLog(store), lambda: T0)
    assert (await retention.run()).erased.conversations == 1  # "old", 31 days idle
    assert await cached() == 0
    assert not await calculate(ids["new"])  # made again, now in "new"
    await erasure.conversations(fay.id, [ids["new"]])
    assert await cached() == 0
