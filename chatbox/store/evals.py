"""Eval runs: a model's answers to a suite's cases, each case's check and score.

The prompts are the admin's suite and the answers the model's to them: no person's content.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from chatbox.store.db import Database

MAX_ANSWER_CHARS = 4000  # enough to read why a case failed on the console


@dataclass(frozen=True)
class EvalResult:
    case_id: str
    category: str
    check: str
    passed: bool
    score: float
    latency_s: float
    answer: str
    detail: str

    @classmethod
    def from_row(cls, row: Any) -> EvalResult:
        return cls(
            row["case_id"],
            row["category"],
            row["check_kind"],
            bool(row["passed"]),
            float(row["score"]),
            float(row["latency_s"]),
            row["answer"],
            row["detail"],
        )


@dataclass(frozen=True)
class EvalRun:
    id: str
    model: str
    suite: str
    suite_digest: str
    judge: str | None
    actor_name: str
    started_at: float
    finished_at: float | None
    cases: int
    passed: int
    score: float | None

    @classmethod
    def from_row(cls, row: Any) -> EvalRun:
        return cls(
            row["id"],
            row["model"],
            row["suite"],
            row["suite_digest"],
            row["judge"],
            row["actor_name"],
            row["started_at"],
            row["finished_at"],
            int(row["cases"]),
            int(row["passed"]),
            row["score"],
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model,
            "suite": self.suite,
            "suite_digest": self.suite_digest,
            "judge": self.judge,
            "actor": self.actor_name,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "cases": self.cases,
            "passed": self.passed,
            "score": self.score,
        }


class EvalRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def save(
        self,
        model: str,
        suite: str,
        suite_digest: str,
        judge: str | None,
        actor_name: str,
        started_at: float,
        results: list[EvalResult],
    ) -> EvalRun:
        """One finished run and its results, in one transaction."""
        run_id = uuid.uuid4().hex
        now = time.time()
        passed = sum(r.passed for r in results)
        score = sum(r.score for r in results) / len(results) if results else None
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO eval_runs (id, model, suite, suite_digest, judge, actor_name,"
                " started_at, finished_at, cases, passed, score)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    model,
                    suite,
                    suite_digest,
                    judge,
                    actor_name,
                    started_at,
                    now,
                    len(results),
                    passed,
                    score,
                ),
            )
            await tx.executemany(
                "INSERT INTO eval_results (run_id, case_id, category, check_kind, passed, score,"
                " latency_s, answer, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        run_id,
                        r.case_id,
                        r.category,
                        r.check,
                        int(r.passed),
                        r.score,
                        r.latency_s,
                        r.answer[:MAX_ANSWER_CHARS],
                        r.detail,
                    )
                    for r in results
                ],
            )
        return EvalRun(
            run_id,
            model,
            suite,
            suite_digest,
            judge,
            actor_name,
            started_at,
            now,
            len(results),
            passed,
            score,
        )

    async def runs(self, model: str | None = None, limit: int = 100) -> list[EvalRun]:
        """The newest runs first (of one model, or all)."""
        where, params = ("WHERE model = ?", (model,)) if model else ("", ())
        rows = await self.db.fetchall(
            f"SELECT * FROM eval_runs {where} ORDER BY started_at DESC LIMIT ?",
            (*params, limit),
        )
        return [EvalRun.from_row(r) for r in rows]

    async def run(self, run_id: str) -> EvalRun | None:
        row = await self.db.fetchone("SELECT * FROM eval_runs WHERE id = ?", (run_id,))
        return EvalRun.from_row(row) if row else None

    async def results(self, run_id: str) -> list[EvalResult]:
        rows = await self.db.fetchall(
            "SELECT * FROM eval_results WHERE run_id = ? ORDER BY rowid", (run_id,)
        )
        return [EvalResult.from_row(r) for r in rows]

    async def latest(self) -> list[EvalRun]:
        """The newest run of each (model, suite): the metrics' gauges."""
        rows = await self.db.fetchall(
            "SELECT r.* FROM eval_runs r WHERE r.started_at = (SELECT max(s.started_at)"
            " FROM eval_runs s WHERE s.model = r.model AND s.suite = r.suite)"
            " ORDER BY r.model, r.suite"
        )
        return [EvalRun.from_row(r) for r in rows]

    async def counts(self) -> dict[tuple[str, str], int]:
        """Runs per (model, suite)."""
        rows = await self.db.fetchall(
            "SELECT model, suite, count(*) AS n FROM eval_runs GROUP BY 1, 2"
        )
        return {(r["model"], r["suite"]): int(r["n"]) for r in rows}


def detail_json(detail: dict[str, Any]) -> str:
    return json.dumps(detail, sort_keys=True)
