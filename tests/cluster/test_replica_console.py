"""Per-replica figures of a front: in /metrics and in the console's live plots' data."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cluster.conftest import Replica, front
from tests.cluster.test_router import ask, new_conversation, preferred
from tests.observability.test_telemetry import sample


@pytest.fixture
def two_replicas(replica_dir: Path) -> Iterator[list[Replica]]:
    started: list[Replica] = []
    try:
        for _ in range(2):
            started.append(Replica(replica_dir))
        yield started
    finally:
        for r in started:
            r.stop()


def live_data(url: str, headers: dict[str, str]) -> dict[str, Any]:
    resp = httpx.get(f"{url}/console/data/live", headers=headers)
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


def test_live_data_has_a_series_per_replica_after_a_request(
    data_dir: Path, two_replicas: list[Replica]
) -> None:
    urls = [r.url for r in two_replicas]
    with front(data_dir, urls, console_sample_s=0.2) as server:
        conv = new_conversation(server.url, server.headers)
        out = ask(server.url, server.headers, conv, "hello there", max_tokens=12)
        assert out["status"] == "complete"
        serving = preferred(conv, urls)
        idle = next(u for u in urls if u != serving)

        text = httpx.get(f"{server.url}/metrics", headers=server.headers).text
        assert sample(text, "chatbox_replica_answers_total", replica=serving) == 1
        assert sample(text, "chatbox_replica_generated_tokens_total", replica=serving) == 12
        for url in urls:
            assert sample(text, "chatbox_replica_up", replica=url) == 1
            assert sample(text, "chatbox_replica_state", replica=url, state="healthy") == 1
            assert sample(text, "chatbox_replica_running", replica=url) == 0
        assert "hello there" not in text and conv not in text

        deadline = time.monotonic() + 10
        while True:  # until a sample after the answer has been taken
            series = live_data(server.url, server.headers)["series"]
            done = [v for v in series.get(f"replica_answers_per_s|{serving}", []) if v]
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert done, sorted(series)
        for url in urls:  # one series per replica for every figure of the replica plots
            for name in (
                "replica_load_running",
                "replica_load_queued",
                "replica_up",
                "replica_tokens_per_s",
                "replica_answers_per_s",
                "replica_faults_failovers",
                "replica_faults_ejections",
            ):
                assert f"{name}|{url}" in series, (name, url, sorted(series))
            assert series[f"replica_up|{url}"][-1] == 1
        assert any(v for v in series[f"replica_tokens_per_s|{serving}"])
        assert not any(v for v in series[f"replica_tokens_per_s|{idle}"])
        assert not any(v for v in series[f"replica_faults_failovers|{serving}"])

        # the Live page has the replica plots (a front without replicas has none)
        page = httpx.get(f"{server.url}/console/live", headers=server.headers).text
        for key in ("replica_tokens_per_s", "replica_load", "replica_up", "replica_faults"):
            assert f'data-plot="{key}"' in page, key
