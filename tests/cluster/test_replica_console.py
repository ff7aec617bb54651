"""Per-replica figures of a front: in /metrics and in the console's live plots' data."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from chatbox.cluster.local import LOCAL
from tests.cluster.conftest import Replica, front, started_replicas
from tests.cluster.test_capacity import conversations_for
from tests.cluster.test_router import ask, new_conversation, preferred
from tests.observability.test_telemetry import sample


@pytest.fixture
def two_replicas(replica_dir: Path) -> Iterator[list[Replica]]:
    with started_replicas(replica_dir, 2) as started:
        yield started


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


def series_when(url: str, headers: dict[str, str], *names: str) -> dict[str, list[Any]]:
    """The live series once every named one has a non-zero value (or after 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        series: dict[str, list[Any]] = live_data(url, headers)["series"]
        if all(any(series.get(n, [])) for n in names) or time.monotonic() > deadline:
            return series
        time.sleep(0.2)


def test_a_replica_only_front_plots_per_model_figures_of_the_answers_it_serves(
    data_dir: Path, replica: Replica
) -> None:
    with front(data_dir, [replica.url], console_sample_s=0.2) as server:
        conv = new_conversation(server.url, server.headers)
        first = ask(server.url, server.headers, conv, "hello there", max_tokens=12)
        second = ask(server.url, server.headers, conv, "and again", max_tokens=12)
        assert first["status"] == second["status"] == "complete"

        # /metrics: the front measured both answers per model; no engine runs here
        text = httpx.get(f"{server.url}/metrics", headers=server.headers).text
        assert sample(text, "chatbox_remote_generated_tokens_total", model="tiny") == 24
        assert sample(text, "chatbox_remote_time_to_first_token_seconds_count", model="tiny") == 2
        assert sample(text, "chatbox_remote_time_per_output_token_seconds_count", model="tiny")
        reasons = re.findall(
            r'^chatbox_remote_requests_total\{.*model="tiny".*\} (\S+)$', text, re.M
        )
        assert sum(float(n) for n in reasons) == 2
        # the replica's usage: the second turn reused the first's prefix there
        hit = sample(text, "chatbox_remote_prefix_cache_hit_tokens_total", model="tiny")
        miss = sample(text, "chatbox_remote_prefix_cache_miss_tokens_total", model="tiny")
        prompts = first["usage"]["prompt_tokens"] + second["usage"]["prompt_tokens"]
        assert hit and miss and hit + miss == prompts
        assert sample(text, "chatbox_remote_running_sequences", model="tiny") == 0
        assert sample(text, "chatbox_remote_queue_depth", model="tiny") == 0
        assert (sample(text, "chatbox_remote_kv_cells_total", model="tiny") or 0) > 0
        assert sample(text, "chatbox_engine_generated_tokens_total", model="tiny") is None
        assert "hello there" not in text and conv not in text

        # the Live data: the per-model series a Live page plots are there, and not empty
        # (a sample window may hold only the first turn, whose hit rate is 0: wait for the
        # window that holds the second)
        names = ("tokens_per_s|tiny", "ttft_p50_s|tiny", "tpot_p99_s|tiny", "cache_hit_rate|tiny")
        series = series_when(server.url, server.headers, *names)
        for name in ("tokens_per_s|tiny", "ttft_p50_s|tiny", "ttft_p99_s|tiny", "tpot_p99_s|tiny"):
            assert any(series.get(name, [])), (name, sorted(series))
        for name in (
            "running|tiny",
            "queue_depth|tiny",
            "kv_cells_used|tiny",
            "cache_hit_rate|tiny",
        ):
            assert name in series, (name, sorted(series))
        assert 0 < max(v for v in series["cache_hit_rate|tiny"] if v is not None) < 1
        assert any(series.get("requests_per_s|length", []) + series.get("requests_per_s|stop", []))

        page = httpx.get(f"{server.url}/console/live", headers=server.headers).text
        assert "Served by replicas: tiny" in page and 'id="live-sources"' in page


def test_answers_of_a_model_served_here_and_by_a_replica_are_counted_once(
    data_dir: Path, replica: Replica, tiny_gguf: Path
) -> None:
    with front(data_dir, [replica.url], local=tiny_gguf, console_sample_s=0.2) as server:
        here, there = conversations_for(server, [LOCAL, replica.url], 1)
        for conv in (here, there):
            out = ask(server.url, server.headers, conv, "hi", max_tokens=8)
            assert out["status"] == "complete" and out["usage"]["completion_tokens"] == 8
        text = httpx.get(f"{server.url}/metrics", headers=server.headers).text
        # each answer in one family only: the engine's (here) or the front's record (there)
        assert sample(text, "chatbox_engine_generated_tokens_total", model="tiny") == 8
        assert sample(text, "chatbox_remote_generated_tokens_total", model="tiny") == 8
        assert sample(text, "chatbox_engine_time_to_first_token_seconds_count", model="tiny") == 1
        assert sample(text, "chatbox_remote_time_to_first_token_seconds_count", model="tiny") == 1

        # the Live data adds the two: 16 tokens over the samples
        series = series_when(server.url, server.headers, "tokens_per_s|tiny", "ttft_p50_s|tiny")
        deadline = time.monotonic() + 10
        while True:  # until a sample has seen the second answer too (samples every 0.2 s)
            data = live_data(server.url, server.headers)
            rates, t = data["series"]["tokens_per_s|tiny"], data["t"]
            tokens = sum((b - a) * (r or 0) for a, b, r in zip(t, t[1:], rates[1:], strict=False))
            if tokens > 15.5 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert abs(tokens - 16) < 0.5, (tokens, rates)
        assert any(series["ttft_p50_s|tiny"])
