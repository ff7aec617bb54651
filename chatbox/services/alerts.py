"""Silencing alerts, as an admin does from the console: the silence is kept with the alert
baselines (it outlives a restart) and lands in the audit log."""

from __future__ import annotations

import asyncio

from chatbox.accounts import User
from chatbox.accounts.audit import Actor, AuditLog
from chatbox.observability import Telemetry
from chatbox.observability.alerts import Silence

MAX_SILENCE_MIN = 7 * 24 * 60  # a week: a longer silence is a rule to change instead


class AlertSilences:
    def __init__(self, telemetry: Telemetry, audit: AuditLog) -> None:
        self.telemetry = telemetry
        self.audit = audit

    async def silence(
        self, actor: Actor | User, alertname: str, instance: str, minutes: int
    ) -> Silence:
        """Silence `alertname` (one `instance`; "": all) for `minutes`; ValueError for an
        unknown alert or a period outside 1 minute to a week."""
        if not 1 <= minutes <= MAX_SILENCE_MIN:
            raise ValueError(f"silence for 1 to {MAX_SILENCE_MIN} minutes")
        alerts = self.telemetry.alerts
        until = self.telemetry.clock() + minutes * 60.0
        try:
            made = alerts.silence(alertname, instance, until, Actor.of(actor).name)
        except KeyError as exc:
            raise ValueError(f"no alert is named {alertname}") from exc
        await asyncio.to_thread(alerts.save_baselines)
        await self.audit.record(
            actor, "alert.silence", alertname=alertname, instance=instance, minutes=minutes
        )
        return made

    async def unsilence(self, actor: Actor | User, alertname: str, instance: str) -> bool:
        """End a silence now; False if there was none."""
        alerts = self.telemetry.alerts
        if alerts.unsilence(alertname, instance) is None:
            return False
        await asyncio.to_thread(alerts.save_baselines)
        await self.audit.record(actor, "alert.unsilence", alertname=alertname, instance=instance)
        return True
