"""Limits' counters and background-job claims on one PostgreSQL database, seen from two
fronts (two stores, each its own pool and front id), as several `chatbox serve` share it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from chatbox.store import Store
from chatbox.store.limits import MemoryCounters, PgCounters, Spend
from tests.pg import PgServer


@pytest.fixture
async def fronts(postgres: PgServer) -> AsyncIterator[tuple[Store, Store]]:
    url = postgres.fresh_database()
    a, b = await Store.open(url), await Store.open(url)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def test_a_bucket_is_shared_and_charged_exactly_once_under_a_race(
    fronts: tuple[Store, Store],
) -> None:
    a, b = fronts
    spend = [Spend("u1:requests:10", 10, 1)]
    # Twenty requests at once, ten on each front, against one bucket of ten.
    results = await asyncio.gather(
        *(front.counters.take(spend, None) for front in (a, b) for _ in range(10))
    )
    # A bucket of ten a minute refills one every 6 s: none in this test's time.
    assert sum(r.refused is None for r in results) == 10
    refused = await b.counters.take(spend, None)
    assert refused.refused == "u1:requests:10" and refused.levels["u1:requests:10"] < 1


async def test_streams_count_across_fronts_and_a_dead_fronts_lapse(
    fronts: tuple[Store, Store],
) -> None:
    a, b = fronts
    assert isinstance(a.counters, PgCounters) and isinstance(b.counters, PgCounters)
    a.counters.lease_s = 2.0
    first = await a.counters.take([], ("u1", 1))
    assert first.refused is None and first.lease is not None
    assert (await b.counters.take([], ("u1", 1))).refused == "streams"
    await asyncio.sleep(3.0)  # front a renews its lease while it runs
    assert (await b.counters.take([], ("u1", 1))).refused == "streams"
    a.counters._renewer.cancel()  # type: ignore[union-attr]  # front a stops: it died
    await asyncio.sleep(2.5)  # past the lease: its stream no longer counts
    second = await b.counters.take([], ("u1", 1))
    assert second.refused is None and second.streams == 0


async def test_a_request_of_several_answers_holds_as_many_streams(
    fronts: tuple[Store, Store],
) -> None:
    a, b = fronts
    three = await a.counters.take([], ("u1", 4), 3)
    assert three.refused is None and three.lease is not None
    assert (await b.counters.take([], ("u1", 4), 2)).refused == "streams"
    one = await b.counters.take([], ("u1", 4))
    assert one.refused is None and one.streams == 3
    await a.counters.release(three.lease)  # its three streams end together
    assert (await b.counters.take([], ("u1", 4), 3)).streams == 1


async def test_failed_attempts_count_across_fronts(fronts: tuple[Store, Store]) -> None:
    a, b = fronts
    for _ in range(3):
        await a.counters.fail("pairs", "ann\x00127.0.0.1", 900)
    assert await b.counters.blocked_for("pairs", "ann\x00127.0.0.1", 4, 900) == 0
    await b.counters.fail("pairs", "ann\x00127.0.0.1", 900)
    wait = await a.counters.blocked_for("pairs", "ann\x00127.0.0.1", 4, 900)
    assert 800 < wait <= 900
    await b.counters.forget("pairs", "ann\x00127.0.0.1")
    assert await a.counters.blocked_for("pairs", "ann\x00127.0.0.1", 4, 900) == 0
    # An address that never comes back leaves no row once its window has passed.
    await a.counters.fail("addresses", "198.51.100.7", 1.0)
    await asyncio.sleep(1.5)
    await b.counters.fail("addresses", "203.0.113.9", 1.0)
    rows = await a.db.fetchall("SELECT key FROM limit_failures WHERE counter = 'addresses'")
    assert [r["key"] for r in rows] == ["203.0.113.9"]


async def test_a_job_is_claimed_by_one_front_until_it_is_done(
    fronts: tuple[Store, Store],
) -> None:
    a, b = fronts
    claims = await asyncio.gather(
        *(front.jobs.claim("extract:c1", 60) for front in (a, b) for _ in range(5))
    )
    assert sum(claims) == 1
    winner, loser = (a, b) if any(claims[:5]) else (b, a)
    await loser.jobs.done("extract:c1")  # only the holder lets go
    assert not await loser.jobs.claim("extract:c1", 60)
    await winner.jobs.done("extract:c1")
    assert await loser.jobs.claim("extract:c1", 60)
    assert await winner.jobs.claim("retention-sweep", 2.0)
    assert not await loser.jobs.claim("retention-sweep", 2.0)
    await asyncio.sleep(2.5)  # a claim whose holder died lapses with its term
    assert await loser.jobs.claim("retention-sweep", 2.0)


async def test_in_process_counters_keep_the_same_rules() -> None:
    now = [0.0]
    c = MemoryCounters(lambda: now[0])
    spend = [Spend("u1:requests:2", 2, 1)]
    assert [(await c.take(spend, ("u1", 5))).refused for _ in range(3)] == [
        None,
        None,
        "u1:requests:2",
    ]
    now[0] += 30  # one request back (2 a minute)
    assert (await c.take(spend, None)).refused is None
    held = await c.take([], ("u2", 1))
    assert (await c.take([], ("u2", 1))).refused == "streams"
    assert held.lease is not None
    await c.release(held.lease)
    assert (await c.take([], ("u2", 1))).refused is None
    two = await c.take([], ("u3", 3), 2)
    assert (await c.take([], ("u3", 3), 2)).refused == "streams"
    assert two.lease is not None
    await c.release(two.lease)
    assert (await c.take([], ("u3", 3), 3)).refused is None
