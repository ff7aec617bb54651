"""Pre-warming: each model's hour-of-week profile, learned from the requests counted per
model and hour (`usage_hours`), loads a model ahead of its usual busy hours and unloads one
that has sat idle outside them.

The profile is the mean number of requests in each of the week's 168 hours (Monday 00:00 UTC
first) over the last `HISTORY_WEEKS` weeks, each hour divided by how many times it occurred
in the history. An hour is busy when its mean reaches `BUSY_SHARE` of the model's peak hour
(and at least `MIN_REQUESTS`). Each step, a model whose next `lead_h` hours hold a busy one is
loaded if it is not; a loaded model none of whose next hours is busy, with no request for
`idle_s`, is unloaded, except the pinned ones (the default model, and those an admin pinned:
loaded and kept whatever their hours). With less than a day of history nothing else is
decided. The clock is injectable, so a replay can run a week in minutes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

log = logging.getLogger("chatbox.prewarm")

WEEK_H = 168
HISTORY_WEEKS = 4
MIN_HISTORY_H = 24  # before a day of history the profile says nothing
BUSY_SHARE = 0.5  # an hour is busy at half its model's peak hour or more
MIN_REQUESTS = 1.0  # ... and at least this many requests in it, on average
LEAD_H = 1  # hours ahead a busy hour makes its model load
IDLE_S = 1800.0  # a model unused this long outside its busy hours is unloaded
STEP_S = 60.0  # how often the pre-warmer looks (in the clock's seconds)
MIN_STEP_S = 0.5  # ... and at most this often in real seconds (a replay's fast clock)
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")

HourRow = tuple[str, int, int, int]  # (model, hour since 1970, requests, tokens)


def replay_clock(start: float = 0.0, speed: float = 1.0) -> Callable[[], float]:
    """The wall clock (`start` 0), or a replay's: `start` at its first reading (the server
    is ready by then), then `speed` times as fast as the real time."""
    if not start:
        return time.time
    origin: list[float] = []

    def now() -> float:
        if not origin:
            origin.append(time.time())
        return start + (time.time() - origin[0]) * speed

    return now


def hour_of_week(hour: int) -> int:
    """The hour of the week (0: Monday 00:00-01:00 UTC) of an hour's number since 1970."""
    t = time.gmtime(hour * 3600)
    return t.tm_wday * 24 + t.tm_hour


def label(how: int) -> str:
    return f"{DAYS[how // 24]} {how % 24:02d}:00"


@dataclass(frozen=True)
class Profile:
    """A model's mean requests per hour of the week."""

    model: str
    mean: tuple[float, ...]
    history_h: int

    @property
    def peak(self) -> float:
        return max(self.mean)

    @property
    def peak_at(self) -> int:
        return self.mean.index(self.peak)

    def busy(self, how: int) -> bool:
        return self.mean[how] >= max(MIN_REQUESTS, BUSY_SHARE * self.peak)


def learn(rows: Iterable[HourRow], now_hour: int, weeks: int = HISTORY_WEEKS) -> list[Profile]:
    """Each model's profile from its hourly counts before `now_hour` (the one running now
    is not complete yet); none with less than `MIN_HISTORY_H` hours of history."""
    since = now_hour - weeks * WEEK_H
    rows = [r for r in rows if since <= r[1] < now_hour]
    if not rows:
        return []
    start = min(r[1] for r in rows)
    if now_hour - start < MIN_HISTORY_H:
        return []
    seen = [0] * WEEK_H  # how many times each hour of the week occurs in [start, now_hour)
    for hour in range(start, now_hour):
        seen[hour_of_week(hour)] += 1
    totals: dict[str, list[float]] = {}
    for model, hour, requests, _ in rows:
        totals.setdefault(model, [0.0] * WEEK_H)[hour_of_week(hour)] += requests
    return [
        Profile(
            m,
            tuple(t / s if s else 0.0 for t, s in zip(total, seen, strict=True)),
            now_hour - start,
        )
        for m, total in sorted(totals.items())
    ]


@dataclass(frozen=True)
class Decision:
    at: float  # the clock's time
    action: Literal["load", "unload"]
    model: str
    reason: str


@dataclass
class PreWarmer:
    """Loads and unloads this process's models by their profiles, one step at a time."""

    hourly: Callable[[int], Awaitable[Sequence[HourRow]]]  # rows from an hour on
    names: Callable[[], list[str]]  # the models this process can load
    loaded: Callable[[], list[str]]
    running: Callable[[str], int]  # a loaded model's requests running or waiting
    load: Callable[[str], Awaitable[object]]
    unload: Callable[[str], Awaitable[object]]
    pinned: Callable[[], set[str]]  # never unloaded (the default model)
    # An admin's pins (`chatbox prewarm pin`): loaded and never unloaded; read every step.
    admin_pins: Callable[[], Awaitable[Sequence[str]]] | None = None
    clock: Callable[[], float] = time.time
    lead_h: int = LEAD_H
    idle_s: float = IDLE_S
    speed: float = 1.0  # the clock's seconds per real second (a replay's)
    profiles: list[Profile] = field(default_factory=list)
    decisions: deque[Decision] = field(default_factory=lambda: deque(maxlen=200))
    asleep: set[str] = field(default_factory=set)  # unloaded here and not loaded since
    _last_used: dict[str, float] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None

    async def step(self) -> list[Decision]:
        """Learn the profiles again and load or unload what they call for now."""
        now = self.clock()
        hour = int(now // 3600)
        rows = await self.hourly(hour - HISTORY_WEEKS * WEEK_H)
        self.profiles = learn(rows, hour)
        loaded = set(self.loaded())
        self.asleep -= loaded
        for model, h, requests, _ in rows:
            if requests:  # it was used during that hour: at its end at the latest
                self._last_used[model] = max(
                    self._last_used.get(model, 0.0), min(now, (h + 1) * 3600)
                )
        for model in loaded:
            if self.running(model) > 0:
                self._last_used[model] = now
        known = set(self.names())
        made: list[Decision] = []
        pins = set(await self.admin_pins()) & known if self.admin_pins is not None else set()
        for model in sorted(pins - loaded):
            made.append(await self._act(now, "load", model, "pinned by an admin"))
        keep = self.pinned() | pins
        for p in self.profiles:
            if p.model not in known:
                continue
            ahead = [hour_of_week(hour + k) for k in range(self.lead_h + 1)]
            busy = [a for a in ahead if p.busy(a)]
            if busy and p.model not in loaded:
                reason = (
                    f"busy hour {label(busy[0])} UTC ahead: {p.mean[busy[0]]:.1f} requests/h"
                    f" expected (peak {p.peak:.1f} at {label(p.peak_at)})"
                )
                made.append(await self._act(now, "load", p.model, reason))
            elif not busy and p.model in loaded and p.model not in keep:
                idle = now - self._last_used.get(p.model, now - p.history_h * 3600)
                if idle >= self.idle_s and self.running(p.model) == 0:
                    reason = (
                        f"idle {idle / 60:.0f} min, no busy hour in the next {self.lead_h} h"
                        f" (next {self._next_busy(p, hour)})"
                    )
                    made.append(await self._act(now, "unload", p.model, reason))
        return made

    def _next_busy(self, p: Profile, hour: int) -> str:
        for k in range(1, WEEK_H + 1):
            if p.busy(hour_of_week(hour + k)):
                return f"at {label(hour_of_week(hour + k))} UTC"
        return "none this week"

    async def _act(
        self, now: float, action: Literal["load", "unload"], model: str, why: str
    ) -> Decision:
        decision = Decision(now, action, model, why)
        log.info("pre-warm: %s %s: %s", action, model, why)
        if action == "load":
            await self.load(model)
            self.asleep.discard(model)
            self._last_used[model] = now  # a fresh load is not idle yet
        else:
            await self.unload(model)
            self.asleep.add(model)
        self.decisions.append(decision)
        return decision

    def start(self, every_s: float = STEP_S) -> None:
        """Step every `every_s` seconds of the clock in the background."""

        async def loop() -> None:
            while True:
                try:
                    await self.step()
                except asyncio.CancelledError:
                    raise
                except Exception:  # background work: log it, try again next step
                    log.exception("pre-warm step failed")
                await asyncio.sleep(max(MIN_STEP_S, every_s / self.speed))

        self._task = asyncio.create_task(loop(), name="chatbox-prewarm")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def view(self, hours: int = 24) -> dict[str, Any]:
        """For the console: each model's forecast beside its actual requests over the day
        around now (the last `hours // 2` hours and the next ones), and recent decisions."""
        now = self.clock()
        hour = int(now // 3600)
        first = hour - hours // 2
        actual: dict[tuple[str, int], int] = {}
        for model, h, requests, _ in await self.hourly(first):
            actual[(model, h)] = requests
        loaded = set(self.loaded())
        models = []
        for p in self.profiles:
            rows = []
            for h in range(first, first + hours):
                how = hour_of_week(h)
                rows.append(
                    {
                        "hour": h,
                        "label": label(how),
                        "forecast": round(p.mean[how], 2),
                        "actual": actual.get((p.model, h)) if h <= hour else None,
                        "busy": p.busy(how),
                        "now": h == hour,
                    }
                )
            models.append(
                {
                    "model": p.model,
                    "loaded": p.model in loaded,
                    "peak": round(p.peak, 2),
                    "peak_at": label(p.peak_at),
                    "history_h": p.history_h,
                    "profile": [round(v, 2) for v in p.mean],
                    "hours": rows,
                }
            )
        return {
            "now": now,
            "models": models,
            "decisions": [
                {**asdict(d), "when": time.strftime("%a %Y-%m-%d %H:%M UTC", time.gmtime(d.at))}
                for d in reversed(self.decisions)
            ],
        }


def outlook(
    rows: Iterable[HourRow], pins: Iterable[tuple[str, str, float]], now: float, hours: int = 24
) -> dict[str, Any]:
    """What the pre-warmer knows, for the CLI: the hours of history counted, the admins' pins
    (model, by whom, when) and each learned model's busy hours among the next `hours`."""
    hour = int(now // 3600)
    rows = list(rows)
    first = min((r[1] for r in rows if r[1] < hour), default=hour)
    return {
        "history_h": hour - first,
        "decides_after_h": MIN_HISTORY_H,
        "pins": [{"model": m, "by": by, "at": at} for m, by, at in pins],
        "models": [
            {
                "model": p.model,
                "peak": round(p.peak, 2),
                "peak_at": label(p.peak_at),
                "busy_ahead": [
                    label(hour_of_week(h))
                    for h in range(hour, hour + hours)
                    if p.busy(hour_of_week(h))
                ],
            }
            for p in learn(rows, hour)
        ],
    }
