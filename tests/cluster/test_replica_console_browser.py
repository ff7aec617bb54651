"""The console's Live page of a front with replicas, in headless Chromium: the per-replica
plots render and update without a reload, under the strict CSP.

Run: pytest -m browser tests/cluster/test_replica_console_browser.py
Screenshot: console-live-replicas.png (scripts/screenshots.sh: docs/screenshots)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cluster.conftest import Replica, front
from tests.conftest import LiveServer
from tests.web.test_browser import browser, login, page  # noqa: F401  (shared fixtures)
from tests.web.test_console_browser import SHOTS, plot_state

pytestmark = [
    pytest.mark.browser,
    pytest.mark.store_agnostic("the Live page's per-replica plots in a browser"),
]


@pytest.fixture(scope="module")
def replica(replica_dir: Path) -> Iterator[Replica]:
    started = Replica(replica_dir)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, replica: Replica) -> Iterator[LiveServer]:
    data_dir: Path = tmp_path_factory.mktemp("front") / "data"
    with front(data_dir, [replica.url], console_sample_s=0.5, max_tokens=48) as live:
        ask(live)  # warm: the first answer waits for the moderation classifiers to load
        yield live


def ask(server: LiveServer, client: httpx.Client | None = None) -> int:
    c = client or httpx.Client(base_url=server.url, headers=server.headers, timeout=60)
    body = {"messages": [{"role": "user", "content": "Tell me a story"}]}
    status = c.post("/v1/chat/completions", json=body).status_code
    if client is None:
        c.close()
    return status


def load(server: LiveServer, seconds: float, statuses: list[int]) -> list[threading.Thread]:
    """Two clients asking through the front for `seconds`."""

    def one() -> None:
        end = time.monotonic() + seconds
        with httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as c:
            while time.monotonic() < end:
                statuses.append(ask(server, c))

    threads = [threading.Thread(target=one, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    return threads


def test_replica_plots_render_and_update(
    server: LiveServer,
    replica: Replica,
    page: Any,  # noqa: F811
) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    statuses: list[int] = []
    workers = load(server, 6.0, statuses)
    page.goto(server.url + "/console/live")
    key = "replica_tokens_per_s"
    page.wait_for_selector(f"figure[data-plot={key}][data-rendered=true]")
    first = plot_state(page, key)
    assert first["canvas"] and f"{key}|{replica.url}" in first["series"].split(",")
    page.wait_for_function(
        "([k, n]) => +document.querySelector(`figure[data-plot=${k}]`).dataset.points > n",
        arg=[key, int(first["points"]) + 2],
    )
    assert int(plot_state(page, key)["updates"]) > int(first["updates"])  # no reload
    for other in ("replica_answers_per_s", "replica_load", "replica_up", "replica_faults"):
        page.wait_for_selector(f"figure[data-plot={other}][data-rendered=true]")
    load_series = plot_state(page, "replica_load")["series"].split(",")
    assert {f"replica_load_running|{replica.url}", f"replica_load_queued|{replica.url}"} <= set(
        load_series
    )
    legend = page.inner_text("figure[data-plot=replica_load]")
    host = replica.url.removeprefix("http://")
    assert f"{host} running" in legend and "http://" not in legend  # short, readable labels
    for w in workers:
        w.join()
    assert statuses.count(200) >= 4, statuses
    # what the plots draw: tokens and answers from the replica while the load ran
    live = httpx.get(f"{server.url}/console/data/live", headers=server.headers).json()
    for name in ("replica_tokens_per_s", "replica_answers_per_s"):
        assert max(v or 0 for v in live["series"][f"{name}|{replica.url}"]) > 0, name
    page.wait_for_timeout(1500)  # a poll or two after the load: its peak is on the plots
    page.screenshot(path=str(SHOTS / "console-live-replicas.png"), full_page=True)
