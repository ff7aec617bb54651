"""Rollout changes at run time on a served box, from the CLI on its data directory: a canary
started without a restart takes its share of the tier's answers until it is stopped, and a
model pinned warm is loaded by the pre-warmer; bad requests are refused naming the problem,
and every change is in the audit log."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from chatbox.chat.rollout.canary import CHECK_EVERY_S
from tests.served import Served

pytestmark = pytest.mark.timeout(600)
TIMEOUT = 120.0


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Served]:
    served = Served(
        tmp_path_factory.mktemp("rollout"),
        model=tiny_gguf,
        env={"CHATBOX_PREWARM_STEP_S": "1"},  # the pins are read every second, not minute
    )
    for name in ("tiny2", "tiny3"):  # the canary's; one that nothing asks for (the pin's)
        served.cli("models", "add", str(tiny_gguf), "--name", name, "--link")
    with served:
        yield served


def answered_by(http: httpx.Client) -> str:
    conv = http.post("/v1/conversations", json={"title": "c"}).json()["id"]
    said = http.post(f"/v1/conversations/{conv}/turns", json={"content": "Hi", "max_tokens": 2})
    assert said.status_code == 200, said.text
    return str(http.get(f"/v1/conversations/{conv}").json()["turns"][-1]["model"])


def test_a_canary_started_at_run_time_takes_its_share_until_stopped(box: Served) -> None:
    ann = httpx.Client(
        base_url=box.url, headers=box.auth(box.user("ann", tier="paid")), timeout=TIMEOUT
    )
    assert "tier 'fre' is not a tier" in box.cli_refused(
        "canary", "start", "tiny2", "--tier", "fre", "--percent", "50"
    )
    assert "percent must be more than 0 and at most 100, not 150" in box.cli_refused(
        "canary", "start", "tiny2", "--tier", "paid", "--percent", "150"
    )
    assert "model 'tiny9' is not installed" in box.cli_refused(
        "canary", "start", "tiny9", "--tier", "paid", "--percent", "50"
    )
    assert {answered_by(ann) for _ in range(4)} == {"tiny"}

    said = box.cli("canary", "start", "tiny2", "--tier", "paid", "--percent", "50", "--arm", "live")
    assert "live: tiny2 takes 50% of tier paid's answers" in said
    assert "a canary arm named 'live' runs already" in box.cli_refused(
        "canary", "start", "tiny", "--tier", "free", "--percent", "5", "--arm", "live"
    )
    deadline = time.monotonic() + 2 * CHECK_EVERY_S + 30  # the server's next check
    seen: set[str] = set()
    while "tiny2" not in seen and time.monotonic() < deadline:
        seen.add(answered_by(ann))
        time.sleep(2)  # three requests an answer: within the tier's 120 a minute
    assert "tiny2" in seen, "no answer came from the canary started at run time"
    status = box.cli("canary", "status")
    assert "live: tiny2 on tier paid (50%, started by cli:" in status and "running" in status

    assert "no canary started at run time is named 'nope'" in box.cli_refused(
        "canary", "stop", "nope"
    )
    stopped = box.cli("canary", "stop", "live", "--reason", "enough")
    assert "live: stopped" in stopped
    time.sleep(CHECK_EVERY_S + 2)  # one check later, every answer is the tier's model
    assert {answered_by(ann) for _ in range(8)} == {"tiny"}
    assert "live" not in box.cli("canary", "status")

    audit = json.loads(box.cli("audit", "list", "--json"))
    done = [(e["action"], e["actor"]["name"][:4]) for e in audit]
    assert ("canary.start", "cli:") in done and ("canary.stop", "cli:") in done


def test_a_pinned_model_is_loaded_by_the_running_server(box: Served) -> None:
    admin = httpx.Client(base_url=box.url, headers=box.admin, timeout=TIMEOUT)
    assert "model 'tiny9' is not installed" in box.cli_refused("prewarm", "pin", "tiny9")
    before = box.cli("prewarm", "status")
    assert "pre-warming loads and unloads by the hours from 24 h on" in before, before
    assert "pinned: none" in before

    assert "tiny3: pinned" in box.cli("prewarm", "pin", "tiny3")
    assert "pinned already" in box.cli("prewarm", "pin", "tiny3")
    deadline = time.monotonic() + 60
    loads: list[dict[str, str]] = []
    while not loads and time.monotonic() < deadline:
        decisions = admin.get("/v1/admin/prewarm").json()["decisions"]
        loads = [d for d in decisions if d["action"] == "load" and d["model"] == "tiny3"]
        time.sleep(0.5)
    assert loads and loads[0]["reason"] == "pinned by an admin"
    assert "pinned: tiny3 (by cli:" in box.cli("prewarm", "status")

    assert "tiny3: unpinned" in box.cli("prewarm", "unpin", "tiny3")
    assert "tiny3 is not pinned" in box.cli_refused("prewarm", "unpin", "tiny3")
    audit = [e["action"] for e in json.loads(box.cli("audit", "list", "--json"))]
    assert "prewarm.pin" in audit and "prewarm.unpin" in audit
