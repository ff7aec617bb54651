"""The admin console's Evals and Canaries pages: eval runs (history, a run's cases, runs
compared case by case) and each canary's verdict against its baseline, with promote, roll
back and resume (htmx posts with the session's CSRF token, audit-logged by the service); and
the admin API that runs a suite on the server's own engines (what `chatbox eval run --server`
talks to)."""

from __future__ import annotations

import json
from typing import Any

from litestar import Controller, Response, get, post
from litestar.exceptions import ClientException, NotFoundException, PermissionDeniedException
from msgspec import Struct, convert

from chatbox.accounts import User
from chatbox.chat.rollout.canary import CanaryService
from chatbox.chat.rollout.evalsuite import SuiteError, suite_from
from chatbox.chat.rollout.evaluation import EvalError, Evaluator
from chatbox.services.server import Services
from chatbox.web.auth import AnyRequest
from chatbox.web.console.actions import page, require_admin
from chatbox.web.deps import ServicesDep, UserDep
from chatbox.web.errors import ERROR_RESPONSES, InvalidBody
from chatbox.web.ui.helpers import UI_EXCEPTION_HANDLERS

MAX_COMPARED = 6  # runs side by side on one page
UNNAMED_SUITE = "suite"  # the name of a suite sent with neither a "name" nor `name`


class EvalRunIn(Struct, forbid_unknown_fields=True):
    """A suite to run on one of the server's models, as `chatbox eval run` runs a file."""

    model: str
    suite: dict[str, Any]  # the suite document, in the format of a suite file
    judge: str | None = None  # grades `judge` checks (default: the suite's "judge")
    name: str | None = None  # the suite's name where the document has none (a file's stem)


class EvalResultOut(Struct, forbid_unknown_fields=True):
    """One case: its check, whether it passed, its score, the answer and what the check found."""

    case_id: str
    category: str
    check: str
    passed: bool
    score: float
    latency_s: float
    answer: str
    detail: str  # a JSON object: what the check found (empty when nothing)


class EvalRunOut(Struct, forbid_unknown_fields=True):
    """A stored eval run and its cases (what `chatbox eval run --json` prints)."""

    id: str
    model: str
    suite: str
    suite_digest: str
    judge: str | None
    actor: str
    started_at: float
    finished_at: float | None
    cases: int
    passed: int
    score: float | None
    results: list[EvalResultOut]


def _evals(services: Services) -> Evaluator:
    if services.evals is None:
        raise NotFoundException("evals are not run in this process")
    return services.evals


def _admin(user: User) -> None:
    if user.role != "admin":
        raise PermissionDeniedException("only admins can run eval suites")


class EvalsApiController(Controller):
    path = "/v1/admin"
    tags = ["admin"]

    @post("/evals", status_code=201, responses=ERROR_RESPONSES)
    async def run_suite(self, data: EvalRunIn, services: ServicesDep, user: UserDep) -> EvalRunOut:
        """Run a suite on one of the server's models through its engines, policy and
        admission, as the calling admin; the stored run (audit-logged) and its cases. The
        answer comes when every case is done."""
        _admin(user)
        evals = _evals(services)
        try:
            suite = suite_from(data.suite, data.name or UNNAMED_SUITE)
        except SuiteError as exc:
            raise InvalidBody(str(exc), "suite") from exc
        try:
            run = await evals.run(user, data.model, suite, data.judge)
        except EvalError as exc:
            raise ClientException(str(exc)) from exc
        run, results = await evals.detail(run.id)
        return convert({**run.as_dict(), "results": [r.__dict__ for r in results]}, EvalRunOut)


def _canaries(services: Services) -> CanaryService:
    if services.canaries is None:
        raise NotFoundException("canaries are not watched in this process")
    return services.canaries


class ConsoleVerdictsController(Controller):
    path = "/console"
    include_in_schema = False
    exception_handlers = UI_EXCEPTION_HANDLERS

    # -- evals -------------------------------------------------------------------------------

    @get("/evals", name="console_evals")
    async def evals(
        self,
        request: AnyRequest,
        services: ServicesDep,
        user: UserDep,
        model: str | None = None,
        runs: list[str] | None = None,
    ) -> Response[str]:
        require_admin(user)
        evals = _evals(services)
        history = await evals.runs(model or None, 200)
        compared = None
        if runs:
            ids = [r for r in runs if r][:MAX_COMPARED]
            try:
                compared = await evals.compare(ids)
            except LookupError as exc:
                raise NotFoundException("no such eval run") from exc
        models = sorted({r.model for r in await evals.runs(None, 1000)})
        return page(
            request,
            "console_evals.html",
            "evals",
            runs=history,
            models=models,
            model=model or "",
            compared=compared,
        )

    @get("/evals/{run_id:str}", name="console_eval_run")
    async def eval_run(
        self, request: AnyRequest, services: ServicesDep, user: UserDep, run_id: str
    ) -> Response[Any]:
        require_admin(user)
        try:
            run, results = await _evals(services).detail(run_id)
        except LookupError as exc:
            raise NotFoundException("no such eval run") from exc
        if "application/json" in request.headers.get("accept", ""):
            return Response({**run.as_dict(), "results": [r.__dict__ for r in results]})
        shown = [{**r.__dict__, "why": json.loads(r.detail or "{}")} for r in results]
        return page(request, "console_eval_run.html", "evals", run=run, results=shown)

    @get("/data/evals")
    async def evals_data(
        self, services: ServicesDep, user: UserDep, model: str | None = None
    ) -> dict[str, Any]:
        require_admin(user)
        return {"runs": [r.as_dict() for r in await _evals(services).runs(model or None, 200)]}

    # -- canaries ----------------------------------------------------------------------------

    @get("/canaries", name="console_canaries")
    async def canaries(
        self, request: AnyRequest, services: ServicesDep, user: UserDep
    ) -> Response[str]:
        require_admin(user)
        return await self._canaries_page(request, services, "")

    @get("/data/canaries")
    async def canaries_data(self, services: ServicesDep, user: UserDep) -> dict[str, Any]:
        require_admin(user)
        return {"canaries": await _canaries(services).status()}

    @post("/canaries/{arm:str}/{action:str}", status_code=200, name="console_canary_action")
    async def canary_action(
        self, request: AnyRequest, services: ServicesDep, user: UserDep, arm: str, action: str
    ) -> Response[str]:
        """promote, rollback or resume."""
        require_admin(user)
        canaries = _canaries(services)
        decide = {
            "promote": canaries.promote,
            "rollback": canaries.rollback,
            "resume": canaries.resume,
        }.get(action)
        if decide is None:
            raise ClientException("the action must be promote, rollback or resume")
        try:
            await decide(user, arm)
        except LookupError as exc:
            raise NotFoundException(str(exc).strip("'\"")) from exc
        done = {"promote": "promoted", "rollback": "rolled back", "resume": "resumed"}[action]
        return await self._canaries_page(request, services, f"{arm} {done}.")

    async def _canaries_page(
        self, request: AnyRequest, services: Services, notice: str
    ) -> Response[str]:
        return page(
            request,
            "console_canaries.html",
            "canaries",
            canaries=await _canaries(services).status(),
            notice=notice,
        )
