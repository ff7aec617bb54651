"""Pre-warming from a synthetic history with a fake clock: a model busy on weekday office
hours is loaded before its peak and unloaded once idle after it; the default stays loaded;
with too little history nothing is decided."""

from __future__ import annotations

import calendar
import time
from collections.abc import Sequence

import pytest

from chatbox.chat.rollout.prewarm import HourRow, PreWarmer, hour_of_week, learn

MONDAY = calendar.timegm((2026, 11, 30, 0, 0, 0))  # a Monday, 00:00 UTC
H = 3600


def office_hours(weeks: int, until: float) -> list[HourRow]:
    """`paid`: 20 requests an hour 09-17 on weekdays, none otherwise; `tiny` (the default):
    a few every hour. From `weeks` weeks before Monday until `until`."""
    rows: list[HourRow] = []
    first = (MONDAY - weeks * 7 * 24 * H) // H
    for hour in range(int(first), int(until // H)):
        how = hour_of_week(hour)
        day, clock = divmod(how, 24)
        if day < 5 and 9 <= clock < 17:
            rows.append(("paid", hour, 20, 2000))
        rows.append(("tiny", hour, 3, 300))
    return rows


class Box:
    """A fake engine pool and usage history under a fake clock."""

    def __init__(self, rows: list[HourRow], now: float) -> None:
        self.rows = rows
        self.now = now
        self.held = {"tiny"}
        self.log: list[tuple[float, str, str]] = []

    async def hourly(self, since: int) -> Sequence[HourRow]:
        return [r for r in self.rows if r[1] >= since and r[1] * H <= self.now]

    async def load(self, name: str) -> None:
        self.held.add(name)
        self.log.append((self.now, "load", name))

    async def unload(self, name: str) -> None:
        self.held.discard(name)
        self.log.append((self.now, "unload", name))

    def warmer(self) -> PreWarmer:
        return PreWarmer(
            self.hourly,
            lambda: ["tiny", "paid"],
            lambda: sorted(self.held),
            lambda name: 0,
            self.load,
            self.unload,
            lambda: {"tiny"},
            clock=lambda: self.now,
            idle_s=1800,
        )


def test_the_profile_is_the_mean_per_hour_of_the_week() -> None:
    profiles = {p.model: p for p in learn(office_hours(2, MONDAY), MONDAY // H)}
    paid = profiles["paid"]
    assert paid.mean[9] == 20 and paid.mean[8] == 0 and paid.mean[5 * 24 + 10] == 0
    assert paid.peak == 20 and paid.busy(9) and not paid.busy(17)
    assert profiles["tiny"].mean[3] == 3


async def test_loads_before_the_peak_and_unloads_when_idle_after_it() -> None:
    box = Box(office_hours(2, MONDAY + 24 * H), MONDAY + 6 * H)
    warmer = box.warmer()
    # Replay Monday from 06:00 to 20:00 in ten-minute steps.
    while box.now < MONDAY + 20 * H:
        await warmer.step()
        box.now += 600
    loads = [(t, n) for t, a, n in box.log if a == "load"]
    unloads = [(t, n) for t, a, n in box.log if a == "unload"]
    assert [n for _, n in loads] == ["paid"]
    assert MONDAY + 7 * H <= loads[0][0] < MONDAY + 9 * H  # before the 09:00 peak
    assert [n for _, n in unloads] == ["paid"]
    # After the last busy hour (16:00-17:00) and half an hour without a request.
    assert MONDAY + 17 * H + 1800 <= unloads[0][0] <= MONDAY + 18 * H + 600
    assert "tiny" in box.held  # the default is never unloaded
    reasons = [d.reason for d in warmer.decisions]
    assert "busy hour Mon 09:00 UTC ahead" in reasons[0], reasons
    assert "idle" in reasons[1], reasons
    assert warmer.asleep == {"paid"}


async def test_nothing_is_decided_before_a_day_of_history() -> None:
    rows = [r for r in office_hours(0, MONDAY + 12 * H) if r[1] * H >= MONDAY]
    box = Box(rows, MONDAY + 8 * H)
    assert await box.warmer().step() == []
    assert box.held == {"tiny"}


async def test_a_pinned_model_loads_at_once_and_stays_through_its_quiet_hours() -> None:
    box = Box(office_hours(2, MONDAY + 24 * H), MONDAY + 6 * H)
    pins = ["paid"]

    async def admin_pins() -> list[str]:
        return list(pins)

    warmer = box.warmer()
    warmer.admin_pins = admin_pins
    [first] = await warmer.step()
    assert (first.action, first.model, first.reason) == ("load", "paid", "pinned by an admin")
    while box.now < MONDAY + 20 * H:  # past its busy hours and idle: kept, being pinned
        await warmer.step()
        box.now += 600
    assert [a for _, a, _ in box.log] == ["load"] and "paid" in box.held
    pins.clear()  # unpinned: unloaded once idle outside its busy hours
    box.now += 600
    await warmer.step()
    assert box.log[-1][1:] == ("unload", "paid")


def test_the_outlook_says_how_much_history_there_is_and_what_is_busy_ahead() -> None:
    from chatbox.chat.rollout.prewarm import outlook

    early = outlook(office_hours(0, MONDAY + 5 * H), [("paid", "cli:ops", 1.0)], MONDAY + 5 * H)
    assert early["history_h"] == 5 and early["decides_after_h"] == 24
    assert early["models"] == [] and early["pins"][0]["model"] == "paid"
    later = outlook(office_hours(2, MONDAY), [], MONDAY + 6 * H)
    [paid] = [m for m in later["models"] if m["model"] == "paid"]
    assert paid["busy_ahead"][0] == "Mon 09:00" and paid["busy_ahead"][-1] == "Mon 16:00"


@pytest.mark.parametrize("hour", [0, 23, 24 * 6 + 23])
def test_hours_of_the_week_start_on_monday(hour: int) -> None:
    assert hour_of_week(MONDAY // H + hour) == hour


def test_a_replay_clock_starts_at_its_first_reading_and_runs_faster() -> None:
    from chatbox.chat.rollout.prewarm import replay_clock

    clock = replay_clock(MONDAY, 3600.0)
    time.sleep(0.05)  # before the first reading: the replay has not started
    first = clock()
    assert MONDAY <= first < MONDAY + 60
    time.sleep(0.05)
    assert clock() - first >= 0.05 * 3600 * 0.9  # an hour a real second
    assert replay_clock() is time.time
