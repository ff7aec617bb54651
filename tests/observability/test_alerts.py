"""Alert rules on the real metric families, sampled on a fake clock: an error burst and a
latency spike each fire one alert (logged and posted in Alertmanager's webhook shape) and
resolve once traffic is normal again; a quiet day fires nothing; a replica down and a full
disk fire on their fixed bounds, after the samples the docs say; each post carries its
group's whole state with absolute links; an overload just after a start is not learned as
usual, and baselines outlive a restart."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry, Gauge

from chatbox.chat.rollout.prewarm import replay_clock
from chatbox.engine.metrics import EngineMetricFamilies
from chatbox.observability import Telemetry
from chatbox.observability.alert_rules import RULES
from chatbox.observability.alerts import Alert, Alerts

STEP_S = 5.0
HOOK = "http://hook.example/alerts"


class Box:
    """Engine metrics, the telemetry that samples them, a fake clock, a webhook's inbox."""

    def __init__(self, disk: list[float] | None = None, **alerts: Any) -> None:
        self.registry = CollectorRegistry()
        self.engine = EngineMetricFamilies(self.registry)
        self.posted: list[dict[str, Any]] = []

        def hook(request: httpx.Request) -> httpx.Response:
            assert str(request.url) == HOOK
            self.posted.append(json.loads(request.content))
            return httpx.Response(200)

        self.disk = disk
        rules = Alerts(
            webhook_url=HOOK,
            transport=httpx.MockTransport(hook),
            disk=(lambda: self.disk[0]) if self.disk is not None else None,
            **alerts,
        )
        self.telemetry = Telemetry(self.registry, sample_s=STEP_S, alerts=rules)
        self.t = 1_800_000_000.0

    def step(
        self, ok: int = 10, errors: int = 0, ttft_s: float = 0.2, dt: float = STEP_S
    ) -> list[Alert]:
        """One sample's worth of finished answers, then the sample (and the rules) at t+dt."""
        requests = self.engine.requests
        requests.labels(model="tiny", finish_reason="stop").inc(ok)
        requests.labels(model="tiny", finish_reason="error").inc(errors)
        for _ in range(ok + errors):
            self.engine.ttft.labels(model="tiny").observe(ttft_s)
        self.t += dt
        return asyncio.run(self.telemetry.sample_once(self.t))

    def run(self, n: int, **kw: Any) -> list[Alert]:
        return [a for _ in range(n) for a in self.step(**kw)]

    def normal(self, n: int) -> list[Alert]:
        """Ordinary traffic: now and then one failed answer of ten."""
        return [a for i in range(n) for a in self.step(errors=1 if i % 7 == 3 else 0)]


def _names(alerts: list[Alert]) -> list[tuple[str, str]]:
    return [(a.rule.name, a.status) for a in alerts]


def test_an_error_burst_fires_an_alert_that_resolves(caplog: pytest.LogCaptureFixture) -> None:
    box = Box()
    caplog.set_level(logging.INFO, logger="chatbox.alerts")
    assert box.normal(60) == []  # five quiet minutes: a baseline, and no alert
    learned = box.telemetry.alerts.baseline("ChatboxErrorRateHigh")
    assert learned is not None and 0.0 < learned.mean < 0.05

    assert box.step(ok=2, errors=8) == []  # one bad sample is not yet an alert
    fired = box.step(ok=2, errors=8)
    assert _names(fired) == [("ChatboxErrorRateHigh", "firing")]
    assert [a.rule.name for a in box.telemetry.alerts.firing()] == ["ChatboxErrorRateHigh"]
    assert box.run(3, ok=3, errors=7) == []  # still firing: no new change

    hook = box.posted[-1]
    assert hook["version"] == "4" and hook["status"] == "firing"
    (sent,) = hook["alerts"]
    assert sent["labels"]["alertname"] == "ChatboxErrorRateHigh"
    assert sent["labels"]["severity"] == "critical"
    assert sent["status"] == "firing" and sent["startsAt"].endswith("Z")
    assert "of answers failed" in sent["annotations"]["summary"]
    assert any(
        r.levelname == "WARNING" and "alert firing" in r.getMessage() for r in caplog.records
    )

    assert box.normal(2) == []  # hysteresis: two good samples do not resolve it
    resolved = box.normal(1)
    assert _names(resolved) == [("ChatboxErrorRateHigh", "resolved")]
    assert box.posted[-1]["status"] == "resolved"
    assert box.posted[-1]["alerts"][0]["endsAt"] > box.posted[-1]["alerts"][0]["startsAt"]
    assert box.telemetry.alerts.firing() == []
    assert any("alert resolved" in r.getMessage() for r in caplog.records)
    assert box.normal(30) == []  # the burst was not learned as normal


def test_a_latency_spike_fires_and_resolves_on_the_learned_ttft() -> None:
    box = Box()
    assert box.normal(40) == []
    changes = box.run(4, ttft_s=8.0)
    assert ("ChatboxTTFTHigh", "firing") in _names(changes)
    spike = next(a for a in changes if a.rule.name == "ChatboxTTFTHigh")
    assert spike.labels["model"] == "tiny"
    # p99 is over the last minute: it resolves once the spike has left that window.
    after = box.normal(20)
    assert ("ChatboxTTFTHigh", "resolved") in _names(after)
    assert box.telemetry.alerts.firing() == []


def test_on_a_replays_clock_a_ttft_spike_resolves_within_replayed_minutes() -> None:
    """At 900x a sample every half real second is 450 replayed seconds apart: the p99 window
    (a minute of the same clock) must not stretch over the dozen samples before it."""
    box = Box()
    replayed = 450.0
    assert [a for _ in range(20) for a in box.step(dt=replayed)] == []
    spike = [a for _ in range(4) for a in box.step(ttft_s=8.0, dt=replayed)]
    assert ("ChatboxTTFTHigh", "firing") in _names(spike)
    spike_ends = box.t
    after: list[Alert] = []
    while box.t < spike_ends + 2 * 3600 and not after:
        after = [a for a in box.step(dt=replayed) if a.rule.name == "ChatboxTTFTHigh"]
    assert _names(after) == [("ChatboxTTFTHigh", "resolved")]
    (resolved,) = after
    assert resolved.ends_at is not None and resolved.ends_at - spike_ends <= 30 * 60


def test_the_sampler_stamps_its_samples_with_the_servers_replay_clock() -> None:
    registry = CollectorRegistry()
    EngineMetricFamilies(registry).requests.labels(model="tiny", finish_reason="stop").inc()
    telemetry = Telemetry(registry, sample_s=1.0)  # as the benchmark's replay asks
    start = 1_000_000_000.0  # a replayed day long before the real one
    clock = replay_clock(start, 900.0)

    async def sample_a_while() -> list[float]:
        await telemetry.start(clock, 900.0)
        try:
            for _ in range(300):  # up to a minute on a loaded machine
                if len(telemetry.ring.rows) >= 3:
                    break
                await asyncio.sleep(0.2)
        finally:
            await telemetry.stop()
        return [t for t, _ in telemetry.ring.rows]

    stamps = asyncio.run(sample_a_while())
    assert len(stamps) >= 3
    assert all(start <= t < start + 86400 for t in stamps)  # the replay's time, not the wall's
    # A second of that clock asked for: samples come replayed minutes apart, not hours.
    assert stamps[2] - stamps[0] < 2 * 3600


def test_a_replica_down_and_a_filling_disk_fire_on_fixed_bounds() -> None:
    box = Box(disk=[0.5])
    up = Gauge("chatbox_replica_up", "up", ["replica"], registry=box.registry)
    up.labels(replica="http://r1:8001").set(1)
    assert box.normal(3) == []
    up.labels(replica="http://r1:8001").set(0)
    box.disk = [0.95]
    changes = box.normal(2)
    assert sorted(_names(changes)) == [
        ("ChatboxDiskFilling", "firing"),
        ("ChatboxReplicaDown", "firing"),
    ]
    down = next(a for a in changes if a.rule.name == "ChatboxReplicaDown")
    assert down.labels["replica"] == "http://r1:8001"
    box.disk = [0.87]  # between the bounds: still firing
    assert box.normal(1) == []
    box.disk = [0.8]
    up.labels(replica="http://r1:8001").set(1)
    changes = box.normal(3)
    assert sorted(_names(changes)) == [
        ("ChatboxDiskFilling", "resolved"),
        ("ChatboxReplicaDown", "resolved"),
    ]


ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_prometheus_rules_match_the_rules_chatbox_runs() -> None:
    text = (ROOT / "docs" / "prometheus-rules.yml").read_text()
    groups = yaml.safe_load(text)["groups"]
    alerts = {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}
    assert set(alerts) == {rule.name for rule in RULES}
    for rule in RULES:
        assert alerts[rule.name]["labels"]["severity"] == rule.severity, rule.name
        assert "keep_firing_for" in alerts[rule.name], rule.name  # the hysteresis
    # Every metric the rules read is one chatbox exports (engine and remote share suffixes).
    source = " ".join(p.read_text() for p in (ROOT / "chatbox").rglob("*.py"))
    names = set(re.findall(r"chatbox_[a-z_()|]+[a-z]", text.replace("(engine|remote)", "engine")))
    for name in sorted(names):
        family = re.sub(r"_(total|bucket)$", "", name)
        exported = f'"{family}"' in source or f'"{name}"' in source
        assert exported, f"{name} is not a metric chatbox exports"


def test_a_filling_disk_fires_after_two_samples_and_resolves_after_three_as_documented() -> None:
    docs = (ROOT / "docs" / "observability.md").read_text()
    assert "fires after 2 breaching samples" in docs and "resolves after 3 samples" in docs
    box = Box(disk=[0.5])
    assert box.normal(3) == []
    box.disk = [0.928]
    assert box.normal(1) == []  # one sample over 90 % is not yet an alert
    (fired,) = box.normal(1)
    assert _names([fired]) == [("ChatboxDiskFilling", "firing")]
    assert fired.summary() == "the data directory's disk is 92.8% full"
    assert box.posted[-1]["alerts"][0]["annotations"]["summary"].endswith("92.8% full")
    box.disk = [0.5]
    assert box.normal(2) == []  # two clear samples do not resolve it
    assert _names(box.normal(1)) == [("ChatboxDiskFilling", "resolved")]


def test_rates_are_shown_as_percentages() -> None:
    box = Box()
    box.normal(60)
    box.step(ok=2, errors=8)
    (fired,) = box.step(ok=2, errors=8)
    assert re.fullmatch(r"80% of answers failed \(usually under [\d.]+%\)", fired.summary())


def test_each_post_carries_its_groups_whole_state_with_absolute_links() -> None:
    box = Box(disk=[0.5], external_url="https://chat.example.org/")
    up = Gauge("chatbox_replica_up", "up", ["replica"], registry=box.registry)
    for r in ("http://r1:8001", "http://r2:8001"):
        up.labels(replica=r).set(1)
    assert box.normal(3) == []
    for r in ("http://r1:8001", "http://r2:8001"):
        up.labels(replica=r).set(0)
    box.disk = [0.95]
    box.normal(2)
    posts = {p["groupKey"]: p for p in box.posted}
    replicas = posts['{}:{alertname="ChatboxReplicaDown",service="chatbox"}']
    disk = posts['{}:{alertname="ChatboxDiskFilling",service="chatbox"}']
    assert len(box.posted) == 2  # one post per group
    assert replicas["groupLabels"] == {"alertname": "ChatboxReplicaDown", "service": "chatbox"}
    assert replicas["status"] == "firing" and len(replicas["alerts"]) == 2
    assert replicas["commonLabels"]["alertname"] == "ChatboxReplicaDown"
    assert replicas["commonAnnotations"] == {}  # each names its replica
    assert disk["commonAnnotations"] == {"summary": "the data directory's disk is 95% full"}
    for post in (replicas, disk):
        assert post["externalURL"] == "https://chat.example.org"
        for alert in post["alerts"]:
            assert alert["generatorURL"] == "https://chat.example.org/console/live"

    # r1 comes back while r2 stays down: the group's post says both, and still fires.
    box.posted.clear()
    up.labels(replica="http://r1:8001").set(1)
    box.normal(3)
    (post,) = box.posted
    assert post["groupKey"] == '{}:{alertname="ChatboxReplicaDown",service="chatbox"}'
    assert post["status"] == "firing"
    states = {a["labels"]["replica"]: a["status"] for a in post["alerts"]}
    assert states == {"http://r1:8001": "resolved", "http://r2:8001": "firing"}

    # The disk resolves: its own group's post; the replicas' group is not posted again.
    box.posted.clear()
    box.disk = [0.5]
    box.normal(3)
    (post,) = box.posted
    assert post["groupKey"] == '{}:{alertname="ChatboxDiskFilling",service="chatbox"}'
    assert post["status"] == "resolved"


def _overload(box: Box, n: int) -> list[Alert]:
    return box.run(n, ok=3, errors=7, ttft_s=8.0)


def test_an_overload_just_after_a_start_is_not_learned_as_usual() -> None:
    box = Box()
    assert _overload(box, 12) == []  # the first minute: nothing is judged yet
    assert box.normal(30) == []
    learned = box.telemetry.alerts.baseline("ChatboxErrorRateHigh")
    assert learned is not None and learned.mean < 0.05
    names = _names(_overload(box, 2))
    assert ("ChatboxErrorRateHigh", "firing") in names
    assert ("ChatboxTTFTHigh", "firing") in names


def test_learned_baselines_judge_from_the_first_sample_after_a_restart(tmp_path: Path) -> None:
    kept = tmp_path / "alert-baselines.json"
    box = Box(baselines_path=kept)
    assert box.normal(60) == []
    asyncio.run(box.telemetry.sample_once(box.t + STEP_S))
    box.telemetry.alerts.save_baselines()
    before = box.telemetry.alerts.baseline("ChatboxErrorRateHigh")

    again = Box(baselines_path=kept)  # the restarted server, its counters from zero
    restored = again.telemetry.alerts.baseline("ChatboxErrorRateHigh")
    assert restored is not None and before is not None
    assert (restored.mean, restored.n) == (before.mean, before.n)
    assert again.step() == []  # the first sample has no rates yet
    assert _names(again.step(ok=3, errors=7)) == []
    assert ("ChatboxErrorRateHigh", "firing") in _names(again.step(ok=3, errors=7))


def test_unreadable_kept_baselines_are_ignored(tmp_path: Path) -> None:
    kept = tmp_path / "alert-baselines.json"
    kept.write_text("{not json")
    box = Box(baselines_path=kept)
    assert box.telemetry.alerts.baseline("ChatboxErrorRateHigh") is None
    assert box.normal(3) == []
