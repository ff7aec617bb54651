"""Pre-warming in router mode with a real `chatbox replica`: the replica has `paid` installed
but was started with `tiny` only; the front (no local engine) has learned that `paid` is busy
09:00-17:00 on weekdays and runs a replayed Monday at half an hour a second. Before 09:00 it asks
the replica to load `paid` (the replica protocol's /load, behind the replica's secret), serves
an answer of `paid` through it, and once `paid` has been idle after 17:00 asks it to unload
it; `tiny`, which the replica was started with, stays loaded though it is idle all day. The
load and unload calls refuse a request without the secret, a replica without one, and a model
the replica has not installed."""

from __future__ import annotations

import calendar
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from chatbox.catalog.registry import ModelRegistry
from chatbox.chat.rollout.prewarm import hour_of_week
from tests.cluster.conftest import TOKEN, Replica, front
from tests.conftest import run_sql
from tests.tinymodel import make_tiny_gguf

pytestmark = pytest.mark.timeout(300)
MONDAY = calendar.timegm((2026, 11, 30, 0, 0, 0))
H = 3600


@pytest.fixture(scope="module")
def two_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Path:
    base = tmp_path_factory.mktemp("prewarm-replica")
    data = base / "data"
    registry = ModelRegistry(data / "models", data / "no-manifest.toml")
    registry.add(tiny_gguf, name="tiny", make_default=True, copy=False)
    registry.add(make_tiny_gguf(base / "paid.gguf", seed=77), name="paid", copy=False)
    return data


@pytest.fixture
def replica(two_model_dir: Path) -> Iterator[Replica]:
    one = Replica(two_model_dir)
    try:
        yield one
    finally:
        one.stop()


def seed_history(db: Path | str) -> None:
    """Two weeks: `paid` 20 requests an hour 09-17 on weekdays; `tiny` 4 an hour at night."""
    rows = []
    for hour in range(MONDAY // H - 14 * 24, MONDAY // H):
        day, clock = divmod(hour_of_week(hour), 24)
        if clock < 5:
            rows.append(("tiny", hour, 4, 400))
        if day < 5 and 9 <= clock < 17:
            rows.append(("paid", hour, 20, 2000))
    run_sql(db, "INSERT INTO usage_hours VALUES (?, ?, ?, ?)", *rows)


def loaded(replica: Replica) -> set[str]:
    health = httpx.get(replica.url + "/v1/replica/health", headers=replica.headers, timeout=5)
    return set(health.json()["models"])


def test_the_prewarmer_asks_a_replica_to_load_a_model_before_its_peak_and_to_unload_it_after(
    replica: Replica, tmp_path: Path
) -> None:
    assert loaded(replica) == {"tiny"}
    server = front(
        tmp_path / "front",
        [replica.url],
        replay_start=float(MONDAY + 7 * H + 30 * 60),  # Monday 07:30
        replay_speed=1800.0,
        prewarm=True,
        prewarm_idle_s=1800.0,
    )
    seed_history(server.settings.database)
    seen: list[set[str]] = []
    answered = None
    with server:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            now = loaded(replica)
            seen.append(now)
            warm = httpx.get(server.url + "/v1/admin/prewarm", headers=server.headers, timeout=10)
            made = [(d["action"], d["model"]) for d in warm.json()["decisions"]]
            if made == [("load", "paid")] and answered is None:  # the front knows: ask it
                body = {"model": "paid", "messages": [{"role": "user", "content": "hi"}]}
                answered = httpx.post(
                    server.url + "/v1/chat/completions",
                    json={**body, "max_tokens": 4},
                    headers=server.headers,
                    timeout=30,
                )
                continue  # `now` was read before the load finished: look again
            if answered is not None and "paid" not in now:
                break
            time.sleep(0.1)
        for _ in range(100):  # the decision is recorded once the replica's answer is in
            view = httpx.get(server.url + "/v1/admin/prewarm", headers=server.headers, timeout=10)
            if len(view.json()["decisions"]) >= 2:
                break
            time.sleep(0.1)
    decisions = [(d["action"], d["model"]) for d in reversed(view.json()["decisions"])]
    assert decisions[:2] == [("load", "paid"), ("unload", "paid")], decisions
    first = next(d for d in reversed(view.json()["decisions"]) if d["action"] == "load")
    assert time.gmtime(first["at"]).tm_hour in (7, 8), first  # ahead of the 09:00 peak
    assert answered is not None and answered.status_code == 200, answered.text
    assert answered.json()["model"] == "paid"
    assert any("paid" in s for s in seen), seen  # loaded on the replica in between
    assert seen[-1] == {"tiny"}, seen[-5:]
    assert all("tiny" in s for s in seen)  # started with it: the front never unloads it


def test_load_and_unload_need_the_secret_and_an_installed_model(
    replica: Replica, two_model_dir: Path
) -> None:
    url = replica.url + "/v1/replica/load"
    assert httpx.post(url, json={"model": "paid"}, timeout=10).status_code == 401
    missing = httpx.post(url, json={"model": "nope"}, headers=replica.headers, timeout=10)
    assert missing.status_code == 404 and "no model 'nope' here" in missing.text, missing.text
    assert {"paid", "tiny"} <= set(missing.json()["error"].split("installed: ")[1][:-1].split(", "))
    bad = httpx.post(url, json={"name": "paid"}, headers=replica.headers, timeout=10)
    assert bad.status_code == 400, bad.text
    unload = replica.url + "/v1/replica/unload"
    idle = httpx.post(unload, json={"model": "paid"}, headers=replica.headers, timeout=10)
    assert idle.status_code == 404 and "not loaded" in idle.text
    open_one = Replica(two_model_dir, token=None)
    try:
        refused = httpx.post(open_one.url + "/v1/replica/load", json={"model": "paid"}, timeout=10)
        assert refused.status_code == 403 and "without a token" in refused.text
    finally:
        open_one.stop()
    assert TOKEN in replica.headers["Authorization"]
