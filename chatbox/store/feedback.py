"""Feedback on answers: append-only ratings (up or down) with an optional comment.

Each change is a new row; the newest row of a (turn, person) is the rating that counts.
The comment is content (declared in `chatbox.store.content`): erased with the turn's
conversation and with the account of who wrote it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from chatbox.store.db import Database

Rating = Literal["up", "down"]
RATINGS: tuple[Rating, ...] = ("up", "down")

# The newest row of each (turn, person): the ratings that count.
_LATEST = """
SELECT f.* FROM feedback f
WHERE f.seq = (SELECT max(g.seq) FROM feedback g
               WHERE g.turn_id = f.turn_id AND g.user_id = f.user_id)
"""


@dataclass(frozen=True)
class Feedback:
    seq: int
    turn_id: str
    conversation_id: str
    user_id: str
    rating: Rating
    comment: str | None
    model: str | None
    arm: str | None
    tier: str
    created_at: float

    @classmethod
    def from_row(cls, row: Any) -> Feedback:
        return cls(
            row["seq"],
            row["turn_id"],
            row["conversation_id"],
            row["user_id"],
            row["rating"],
            row["comment"],
            row["model"],
            row["arm"],
            row["tier"],
            row["created_at"],
        )


@dataclass(frozen=True)
class FeedbackTally:
    """The ratings that count for one model and arm."""

    model: str
    arm: str | None
    up: int
    down: int

    @property
    def count(self) -> int:
        return self.up + self.down

    @property
    def up_ratio(self) -> float | None:
        return self.up / self.count if self.count else None


class FeedbackRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def add(
        self,
        turn_id: str,
        conversation_id: str,
        user_id: str,
        rating: Rating,
        comment: str | None,
        model: str | None,
        arm: str | None,
        tier: str,
    ) -> Feedback:
        """A new row: the person's rating of the turn from now on."""
        now = time.time()
        async with self.db.transaction() as tx:
            cur = await tx.execute(
                "INSERT INTO feedback (turn_id, conversation_id, user_id, rating, comment,"
                " model, arm, tier, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING seq",
                (turn_id, conversation_id, user_id, rating, comment, model, arm, tier, now),
            )
            seq = int((await cur.fetchone())[0])
        assert seq is not None
        return Feedback(
            seq, turn_id, conversation_id, user_id, rating, comment, model, arm, tier, now
        )

    async def latest(self, user_id: str, turn_ids: list[str]) -> dict[str, Feedback]:
        """The person's rating that counts of each of these turns (those rated)."""
        if not turn_ids:
            return {}
        rows = await self.db.fetchall_in(
            "SELECT * FROM feedback WHERE turn_id IN ({marks}) AND user_id = ? ORDER BY seq",
            turn_ids,
            (user_id,),
        )
        return {r["turn_id"]: Feedback.from_row(r) for r in rows}  # the newest wins

    async def given_by(self, user_id: str) -> list[Feedback]:
        """Every row the person wrote, oldest first (their export)."""
        rows = await self.db.fetchall(
            "SELECT * FROM feedback WHERE user_id = ? ORDER BY seq", (user_id,)
        )
        return [Feedback.from_row(r) for r in rows]

    async def tallies(self) -> list[FeedbackTally]:
        """Ratings that count, per model and arm (the console's table, the metrics' gauge)."""
        rows = await self.db.fetchall(
            "SELECT coalesce(model, '') AS model, arm,"
            " sum(CASE WHEN rating = 'up' THEN 1 ELSE 0 END) AS up,"
            " sum(CASE WHEN rating = 'down' THEN 1 ELSE 0 END) AS down"
            f" FROM ({_LATEST}) AS latest GROUP BY 1, 2 ORDER BY 1, 2"
        )
        return [FeedbackTally(r["model"], r["arm"], int(r["up"]), int(r["down"])) for r in rows]

    async def tally_for(self, tier: str, arm: str | None, since: float) -> tuple[int, int]:
        """Up and down ratings that count of a tier's answers of one canary arm (None: the
        answers outside any arm) rated since a time."""
        arm_rule = "coalesce(arm, '') = ?"
        rows = await self.db.fetchall(
            "SELECT coalesce(sum(CASE WHEN rating = 'up' THEN 1 ELSE 0 END), 0) AS up,"
            " coalesce(sum(CASE WHEN rating = 'down' THEN 1 ELSE 0 END), 0) AS down"
            f" FROM ({_LATEST}) AS latest WHERE tier = ? AND {arm_rule} AND created_at >= ?",
            (tier, arm or "", since),
        )
        return int(rows[0]["up"]), int(rows[0]["down"])
