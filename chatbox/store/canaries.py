"""Canary decisions (append-only: the newest event of an arm is its state), each arm's
latest verdict (one row per arm, rewritten by the running server, read by the CLI), and the
canaries an admin started at run time."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Literal

from chatbox.store.db import Database

Action = Literal["promote", "rollback", "hold", "resume"]
ACTIONS: tuple[Action, ...] = ("promote", "rollback", "hold", "resume")


@dataclass(frozen=True)
class CanaryEvent:
    seq: int
    arm: str
    tier: str
    model: str
    action: str
    automatic: bool
    reason: str
    actor_name: str
    at: float

    @classmethod
    def from_row(cls, row: Any) -> CanaryEvent:
        return cls(
            row["seq"],
            row["arm"],
            row["tier"],
            row["model"],
            row["action"],
            bool(row["automatic"]),
            row["reason"],
            row["actor_name"],
            row["at"],
        )


@dataclass(frozen=True)
class StartedCanary:
    arm: str
    tier: str
    model: str
    percent: float
    actor_name: str
    at: float


@dataclass(frozen=True)
class StoredVerdict:
    arm: str
    tier: str
    model: str
    verdict: str
    reason: str
    detail: dict[str, Any]
    at: float


class CanaryRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def add_event(
        self,
        arm: str,
        tier: str,
        model: str,
        action: Action,
        reason: str,
        actor_name: str,
        automatic: bool = False,
        at: float | None = None,
    ) -> CanaryEvent:
        at = time.time() if at is None else at
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "INSERT INTO canary_events (arm, tier, model, action, automatic, reason,"
                " actor_name, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING seq",
                (arm, tier, model, action, int(automatic), reason, actor_name, at),
            )
            seq = int((await cur.fetchone())[0])
        return CanaryEvent(seq, arm, tier, model, action, automatic, reason, actor_name, at)

    async def states(self) -> dict[str, CanaryEvent]:
        """Each arm's newest event."""
        rows = await self.db.fetchall(
            "SELECT e.* FROM canary_events e WHERE e.seq ="
            " (SELECT max(f.seq) FROM canary_events f WHERE f.arm = e.arm)"
        )
        return {r["arm"]: CanaryEvent.from_row(r) for r in rows}

    async def events(self, arm: str | None = None, limit: int = 100) -> list[CanaryEvent]:
        """The newest events first."""
        where, params = ("WHERE arm = ?", (arm,)) if arm else ("", ())
        rows = await self.db.fetchall(
            f"SELECT * FROM canary_events {where} ORDER BY seq DESC LIMIT ?", (*params, limit)
        )
        return [CanaryEvent.from_row(r) for r in rows]

    async def put_verdict(self, v: StoredVerdict) -> None:
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO canary_verdicts (arm, tier, model, verdict, reason, detail, at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (arm) DO UPDATE SET"
                " tier = excluded.tier, model = excluded.model, verdict = excluded.verdict,"
                " reason = excluded.reason, detail = excluded.detail, at = excluded.at",
                (v.arm, v.tier, v.model, v.verdict, v.reason, json.dumps(v.detail), v.at),
            )

    async def verdicts(self) -> dict[str, StoredVerdict]:
        rows = await self.db.fetchall("SELECT * FROM canary_verdicts")
        return {
            r["arm"]: StoredVerdict(
                r["arm"],
                r["tier"],
                r["model"],
                r["verdict"],
                r["reason"],
                json.loads(r["detail"]),
                r["at"],
            )
            for r in rows
        }

    async def start(self, c: StartedCanary, reason: str) -> None:
        """Start a canary; its arm's samples count afresh (a `resume` event), so an arm name
        used before starts running. Raises KeyError where the arm runs already."""
        async with self.db.transaction() as tx:
            cur = await tx.execute("SELECT 1 FROM canaries_started WHERE arm = ?", (c.arm,))
            if await cur.fetchone() is not None:
                raise KeyError(c.arm)
            await tx.execute(
                "INSERT INTO canaries_started (arm, tier, model, percent, actor_name, at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (c.arm, c.tier, c.model, c.percent, c.actor_name, c.at),
            )
            await tx.execute(
                "INSERT INTO canary_events (arm, tier, model, action, automatic, reason,"
                " actor_name, at) VALUES (?, ?, ?, 'resume', 0, ?, ?, ?)",
                (c.arm, c.tier, c.model, reason, c.actor_name, c.at),
            )

    async def stop(self, arm: str, reason: str, actor_name: str) -> StartedCanary | None:
        """Stop a started canary (a `rollback` event records it); None where none runs."""
        at = time.time()
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "DELETE FROM canaries_started WHERE arm = ?"
                " RETURNING arm, tier, model, percent, actor_name, at",
                (arm,),
            )
            row = await cur.fetchone()
            if row is None:
                return None
            gone = StartedCanary(row[0], row[1], row[2], float(row[3]), row[4], float(row[5]))
            await tx.execute(
                "INSERT INTO canary_events (arm, tier, model, action, automatic, reason,"
                " actor_name, at) VALUES (?, ?, ?, 'rollback', 0, ?, ?, ?)",
                (gone.arm, gone.tier, gone.model, reason, actor_name, at),
            )
        return gone

    async def started(self) -> list[StartedCanary]:
        rows = await self.db.fetchall("SELECT * FROM canaries_started ORDER BY at, arm")
        return [
            StartedCanary(
                r["arm"], r["tier"], r["model"], float(r["percent"]), r["actor_name"], r["at"]
            )
            for r in rows
        ]
