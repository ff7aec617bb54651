"""Alerts over the metrics chatbox already keeps, each against a learned baseline.

Every sample of the console's metric ring (`MetricRing`), each rule reads one signal per
instance (a model, a replica, the data disk): p99 time to first token, error rate, moderation
refusal rate, queue depth, shed rate, replicas down, the data disk's use. A baseline rule
learns the signal's usual level as an exponentially weighted mean and variance (EWMA) from
quiet samples only, and breaches above `mean + sigmas * std` (and above its absolute
`floor`); a fixed rule breaches at `fire_at`. A new baseline learns nothing in the first
`settle_s` after the start (a cold start's slow answers, or an overload, are not usual) and
judges only once it has learned `warmup` samples; baselines are kept in a file across restarts
and judge from the first sample after one. Hysteresis: an alert fires after `for_n`
breaching samples in a row and resolves after `resolve_n` samples in a row below the lower
bound (half the margin of a baseline rule; `clear_at` for a fixed one); between the two
bounds it holds its state. Samples, their windows and an alert's times follow the server's
clock (a replay's, in accelerated time). Each change is written to the log and posted to a
webhook in Alertmanager's JSON shape (one group per alert name, each post carrying the
group's whole state); the console shows the firing alerts and the recent changes. An admin
may silence an alert (every instance, or one) until a time: as an Alertmanager silence, it
still fires and resolves in the log and the console, but nothing is posted for it until the
silence ends (its group is posted then, if it still fires).
`docs/prometheus-rules.yml` gives the same rules to teams that run Prometheus.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from chatbox.observability.alert_rules import RULES, Baseline, Rule, Sample
from chatbox.observability.ring import Snapshot

log = logging.getLogger("chatbox.alerts")

WEBHOOK_TIMEOUT_S = 5.0
SETTLE_S = 120.0  # after a start, new baselines learn nothing for this long


@dataclass
class Alert:
    """One alert of one instance: firing until it resolves."""

    rule: Rule
    instance: str
    value: float
    bound: float
    starts_at: float
    ends_at: float | None = None

    @property
    def status(self) -> str:
        return "resolved" if self.ends_at is not None else "firing"

    @property
    def labels(self) -> dict[str, str]:
        out = {"alertname": self.rule.name, "severity": self.rule.severity, "service": "chatbox"}
        if self.rule.instance and self.instance:
            out[self.rule.instance] = self.instance
        return out

    def summary(self) -> str:
        return self.rule.summary.format(
            instance=self.instance,
            value=self.rule.show(self.value),
            bound=self.rule.show(self.bound),
        )

    def fingerprint(self) -> str:
        key = "\0".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def as_dict(self, external_url: str = "") -> dict[str, Any]:
        """The alert in Alertmanager's webhook shape (one entry of `alerts`)."""
        return {
            "status": self.status,
            "labels": self.labels,
            "annotations": {"summary": self.summary()},
            "startsAt": _iso(self.starts_at),
            "endsAt": _iso(self.ends_at) if self.ends_at is not None else "0001-01-01T00:00:00Z",
            "generatorURL": external_url.rstrip("/") + "/console/live",
            "fingerprint": self.fingerprint(),
        }


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Silence:
    """No post for alerts of `alertname` (of one `instance`; "": every one) until `until`."""

    alertname: str
    instance: str
    until: float
    by: str  # who silenced it, by name

    def covers(self, alert: Alert) -> bool:
        return alert.rule.name == self.alertname and self.instance in ("", alert.instance)

    def as_dict(self) -> dict[str, str]:
        return {
            "alertname": self.alertname,
            "instance": self.instance,
            "endsAt": _iso(self.until),
            "createdBy": self.by,
        }


@dataclass
class _State:
    baseline: Baseline = field(default_factory=Baseline)
    breaching: int = 0
    clear: int = 0
    alert: Alert | None = None


def group_key(alertname: str) -> str:
    """Alertmanager's key of the group of one alert name (grouped by alertname, service)."""
    return f'{{}}:{{alertname="{alertname}",service="chatbox"}}'


def webhook_payload(alerts: Sequence[Alert], external_url: str = "") -> dict[str, Any]:
    """Alertmanager's webhook JSON (version 4) for one group: the alerts of one name, every
    one firing now and those that resolved since the last post."""
    name = alerts[0].rule.name
    firing = any(a.status == "firing" for a in alerts)
    common = {
        k: v for k, v in alerts[0].labels.items() if all(a.labels.get(k) == v for a in alerts)
    }
    notes = [{"summary": a.summary()} for a in alerts]
    shared = {k: v for k, v in notes[0].items() if all(n.get(k) == v for n in notes)}
    return {
        "version": "4",
        "groupKey": group_key(name),
        "truncatedAlerts": 0,
        "status": "firing" if firing else "resolved",
        "receiver": "chatbox",
        "groupLabels": {"alertname": name, "service": "chatbox"},
        "commonLabels": common,
        "commonAnnotations": shared,
        "externalURL": external_url.rstrip("/"),
        "alerts": [a.as_dict(external_url) for a in alerts],
    }


def disk_fraction(path: Path) -> Callable[[], float | None]:
    """The fraction of `path`'s filesystem in use, read when asked (None if unreadable)."""

    def used() -> float | None:
        try:
            usage = shutil.disk_usage(path)
        except OSError:
            return None
        room = usage.used + usage.free  # as df counts it: blocks kept for root are not room
        return usage.used / room if room else None

    return used


class Alerts:
    """The rules' state: baselines, firing alerts, recent changes; where changes go."""

    def __init__(
        self,
        rules: Sequence[Rule] = RULES,
        webhook_url: str | None = None,
        disk: Callable[[], float | None] | None = None,
        keep: int = 50,
        transport: httpx.AsyncBaseTransport | None = None,
        external_url: str = "",
        baselines_path: Path | None = None,
        settle_s: float = SETTLE_S,
    ) -> None:
        self.rules = tuple(rules)
        self.webhook_url = webhook_url
        self.disk = disk
        self.transport = transport  # tests hand a mock transport for the webhook
        self.external_url = external_url.rstrip("/")  # where the console is, in links
        self.baselines_path = baselines_path  # kept across restarts; None: in RAM only
        self.settle_s = settle_s
        self.recent: deque[Alert] = deque(maxlen=keep)  # changes, newest last
        self._state: dict[tuple[str, str], _State] = {}
        self._first_at: float | None = None
        self._last_at: float | None = None  # the latest sample's time: silences end on it
        self._silences: dict[tuple[str, str], Silence] = {}
        self._ended: list[Silence] = []  # silences that ended since the last post
        self.load_baselines()

    def firing(self) -> list[Alert]:
        """The alerts firing now, oldest first."""
        found = [s.alert for s in self._state.values() if s.alert is not None]
        return sorted(found, key=lambda a: a.starts_at)

    def baseline(self, rule: str, instance: str = "") -> Baseline | None:
        state = self._state.get((rule, instance))
        return state.baseline if state is not None else None

    def evaluate(
        self, row: Mapping[str, float], now: Snapshot, before: Snapshot | None, at: float
    ) -> list[Alert]:
        """Run every rule on one sample; the alerts that fired or resolved now."""
        sample = Sample(row, now, before, self.disk() if self.disk is not None else None)
        if self._first_at is None:
            self._first_at = at
        self._last_at = at
        for key, silence in list(self._silences.items()):
            if silence.until <= at:
                self._ended.append(self._silences.pop(key))
        settled = at - self._first_at >= self.settle_s
        changed: list[Alert] = []
        for rule in self.rules:
            values = rule.signal(sample)
            # An instance with an open alert and no value now (its traffic stopped) is clear.
            for (name, instance), state in self._state.items():
                if name == rule.name and state.alert is not None and instance not in values:
                    values[instance] = None
            for instance, value in values.items():
                state = self._state.setdefault((rule.name, instance), _State())
                alert = self._step(rule, instance, state, value, at, settled)
                if alert is not None:
                    changed.append(alert)
        for alert in changed:
            self.recent.append(alert)
            _log(alert)
        return changed

    def _step(
        self,
        rule: Rule,
        instance: str,
        state: _State,
        value: float | None,
        at: float,
        settled: bool = True,
    ) -> Alert | None:
        fire, clear = self._bounds(rule, state.baseline)
        if value is None or value < clear:
            state.breaching, state.clear = 0, state.clear + 1
        elif fire is not None and value > fire:
            state.breaching, state.clear = state.breaching + 1, 0
        else:  # between the bounds: no change either way
            state.breaching = state.clear = 0
        if value is not None and state.alert is None and state.breaching == 0 and settled:
            state.baseline.learn(value, rule.alpha)
        if state.alert is None and state.breaching >= rule.for_n and value is not None:
            state.alert = Alert(rule, instance, value, fire if fire is not None else 0.0, at)
            return state.alert
        if state.alert is not None:
            if value is not None:
                state.alert.value = max(state.alert.value, value)
            if state.clear >= rule.resolve_n:
                done, state.alert = state.alert, None
                done.ends_at = at
                return done
        return None

    def _bounds(self, rule: Rule, base: Baseline) -> tuple[float | None, float]:
        """(fire above, clear below); fire None: a baseline not learned yet never fires."""
        if rule.fire_at is not None:
            clear = rule.clear_at if rule.clear_at is not None else rule.fire_at
            return rule.fire_at - 1e-12, clear
        if base.n < rule.warmup:
            return None, math.inf
        margin = rule.sigmas * base.std
        return max(rule.floor, base.mean + margin), max(rule.floor / 2, base.mean + margin / 2)

    # -- silences --------------------------------------------------------------------------

    def silence(self, alertname: str, instance: str, until: float, by: str) -> Silence:
        """Post nothing for these alerts until `until` (on the samples' clock); KeyError for
        an alert name no rule has."""
        if alertname not in {r.name for r in self.rules}:
            raise KeyError(alertname)
        made = Silence(alertname, instance, until, by)
        self._silences[(alertname, instance)] = made
        return made

    def unsilence(self, alertname: str, instance: str) -> Silence | None:
        """End a silence now; its group is posted at the next sample if it still fires."""
        ended = self._silences.pop((alertname, instance), None)
        if ended is not None:
            self._ended.append(ended)
        return ended

    def silences(self) -> list[Silence]:
        """The silences in force, soonest to end first."""
        return sorted(self._silences.values(), key=lambda s: s.until)

    def silenced(self, alert: Alert) -> Silence | None:
        return next((s for s in self.silences() if s.covers(alert)), None)

    async def notify(self, changed: Sequence[Alert]) -> None:
        """Post each changed group (the alerts of one name) to the webhook, as Alertmanager
        does: every alert of the group firing now, and those that just resolved; silenced
        alerts are left out, and a group whose silence ended is posted if it still fires. A
        failure is logged, never raised."""
        ended, self._ended = self._ended, []
        if not self.webhook_url:
            return
        firing = [a for a in self.firing() if self.silenced(a) is None]
        changed = [a for a in changed if self.silenced(a) is None]
        woke = [a for a in firing if any(s.covers(a) for s in ended)]
        names = dict.fromkeys(a.rule.name for a in [*changed, *woke])
        for name in names:
            group = [a for a in firing if a.rule.name == name]
            group += [a for a in changed if a.rule.name == name and a.status == "resolved"]
            await self._post(self.webhook_url, webhook_payload(group, self.external_url))

    async def _post(self, url: str, payload: dict[str, Any]) -> None:
        try:
            async with httpx.AsyncClient(
                timeout=WEBHOOK_TIMEOUT_S, transport=self.transport
            ) as client:
                r = await client.post(url, json=payload)
            if r.status_code >= 300:
                log.warning("alert webhook answered %s", r.status_code)
        except httpx.HTTPError as exc:
            log.warning("alert webhook failed: %s", type(exc).__name__)

    # -- baselines across restarts ---------------------------------------------------------

    def save_baselines(self) -> None:
        """Write the learned baselines and the silences to `baselines_path` (whole, or not
        at all)."""
        if self.baselines_path is None:
            return
        kept = {
            f"{name}|{instance}": state.baseline.as_dict()
            for (name, instance), state in self._state.items()
            if state.baseline.n > 0
        }
        silences = [
            {"alertname": s.alertname, "instance": s.instance, "until": s.until, "by": s.by}
            for s in self.silences()
        ]
        tmp = self.baselines_path.with_suffix(".tmp")
        try:
            body = {"version": 1, "baselines": kept, "silences": silences}
            tmp.write_text(json.dumps(body))
            os.replace(tmp, self.baselines_path)
        except OSError as exc:
            log.warning("could not keep the alert baselines in %s: %s", tmp, exc.strerror)

    def load_baselines(self) -> None:
        """Baselines kept by an earlier run: they judge from the first sample."""
        if self.baselines_path is None or not self.baselines_path.exists():
            return
        try:
            raw = json.loads(self.baselines_path.read_text())
            kept = raw["baselines"] if isinstance(raw, dict) else None
            silences = raw.get("silences", []) if isinstance(raw, dict) else []
        except (OSError, ValueError, KeyError):
            kept, silences = None, []
        if not isinstance(kept, dict):
            log.warning("ignoring unreadable alert baselines in %s", self.baselines_path)
            return
        names = {r.name for r in self.rules if r.fire_at is None}
        for key, body in kept.items():
            name, _, instance = str(key).partition("|")
            baseline = Baseline.from_dict(body)
            if name in names and baseline is not None:
                self._state[(name, instance)] = _State(baseline)
        rules = {r.name for r in self.rules}
        for raw_silence in silences if isinstance(silences, list) else []:
            try:
                made = Silence(
                    str(raw_silence["alertname"]),
                    str(raw_silence["instance"]),
                    float(raw_silence["until"]),
                    str(raw_silence["by"]),
                )
            except (KeyError, TypeError, ValueError):
                continue
            if made.alertname in rules:
                self._silences[(made.alertname, made.instance)] = made

    def state_out(self) -> dict[str, Any]:
        """Firing alerts (each with its instance and the end of its silence, if silenced),
        recent changes, the silences in force and the rules' names (the console's JSON)."""
        firing = []
        for a in self.firing():
            out = a.as_dict(self.external_url)
            silence = self.silenced(a)
            out["instance"] = a.instance
            out["silencedUntil"] = _iso(silence.until) if silence is not None else None
            firing.append(out)
        return {
            "firing": firing,
            "recent": [a.as_dict(self.external_url) for a in reversed(self.recent)],
            "silences": [s.as_dict() for s in self.silences()],
            "rules": [r.name for r in self.rules],
        }


def _log(alert: Alert) -> None:
    level = logging.WARNING if alert.status == "firing" else logging.INFO
    log.log(
        level,
        "alert %s: %s",
        alert.status,
        alert.summary(),
        extra={"alertname": alert.rule.name, "alert_status": alert.status, **alert.labels},
    )
