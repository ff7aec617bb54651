"""`chatbox eval run|list|show`: run an eval suite on a model through the same path as an
API request (admission, the engine; moderation for cases that measure the gateway), print
and store the run; with `--server`, on a running server's own engines, policy and admission
(through its admin API), stored in that server's store."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from chatbox.cli.accounts import _settings, _table, with_services
from chatbox.cli.front import admin_call

if TYPE_CHECKING:
    from chatbox.chat.rollout.evaluation import CaseOutcome, EvalResult, EvalRun
    from chatbox.services.commandline import OperatorServices


WHY_CHARS = 60
SERVER_TIMEOUT_S = 3600  # the server answers once every case is done


@click.group("eval")
def eval_group() -> None:
    """Eval suites: prompts with references, scored per model and stored for comparison."""


@eval_group.command("run")
@click.argument("model")
@click.option(
    "--suite",
    "suite_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A suite file (JSON; default: the shipped models/evals/basic.json).",
)
@click.option("--judge", default=None, help="The model that grades `judge` checks.")
@click.option("--as", "as_name", default=None, help="The account to run as (default: an admin).")
@click.option(
    "--server",
    default=None,
    help="Run it on this running server's engines, policy and admission (its URL), as the"
    " key's admin; the run is stored there.",
)
@click.option(
    "--key", default=None, help="With --server: an admin's API key (env: CHATBOX_ADMIN_KEY)."
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=SERVER_TIMEOUT_S,
    show_default=True,
    help="With --server: seconds to wait for the whole run.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the run as JSON.")
@click.pass_context
def run_cmd(
    ctx: click.Context,
    model: str,
    suite_path: Path | None,
    judge: str | None,
    as_name: str | None,
    server: str | None,
    key: str | None,
    timeout_s: float,
    as_json: bool,
) -> None:
    """Run a suite on MODEL; exits 0 when it ran (whatever the score), 1 when it cannot."""
    import asyncio

    from chatbox.chat.rollout.evalsuite import SuiteError, default_suite_path, load_suite
    from chatbox.chat.rollout.evaluation import EvalError
    from chatbox.services import StoreElsewhere
    from chatbox.services.commandline import evaluation_services

    settings = _settings(ctx)
    if server is not None:
        if as_name is not None:
            raise click.UsageError("--as does not apply with --server: it runs as the key's admin")
        run, results = _run_on_server(
            server.rstrip("/"),
            key or settings.admin_key,
            model,
            suite_path or default_suite_path(),
            judge,
            timeout_s,
            as_json,
        )
        _show_run(run, results, as_json)
        return
    try:
        suite = load_suite(suite_path or default_suite_path())
    except SuiteError as exc:
        raise click.ClickException(str(exc)) from exc

    def shown(outcome: CaseOutcome) -> None:
        if not as_json:
            r = outcome.result
            mark = "pass" if r.passed else "FAIL"
            click.echo(f"  {mark}  {r.case_id} ({r.check}, {r.latency_s:.2f} s)", err=True)

    async def go() -> tuple[EvalRun, list[EvalResult]]:
        async with evaluation_services(settings) as services:
            actor = await services.admin(as_name)
            run = await services.evals.run(actor, model, suite, judge, on_case=shown)
            return await services.evals.detail(run.id)

    try:
        run, results = asyncio.run(go())
    except (EvalError, LookupError, StoreElsewhere) as exc:
        raise click.ClickException(str(exc)) from exc
    _show_run(run, results, as_json)


def _run_on_server(
    server: str,
    key: str | None,
    model: str,
    suite_path: Path,
    judge: str | None,
    timeout_s: float,
    as_json: bool,
) -> tuple[EvalRun, list[EvalResult]]:
    """The suite file sent as it is to the server, which checks it as a file is checked."""
    from chatbox.chat.rollout.evalsuite import SuiteError, read_suite_document
    from chatbox.chat.rollout.evaluation import EvalResult, EvalRun

    try:
        document = read_suite_document(suite_path)
    except SuiteError as exc:
        raise click.ClickException(str(exc)) from exc
    if not as_json:
        click.echo(f"running {suite_path.name} on {model} at {server} …", err=True)
    body = {"model": model, "suite": document, "judge": judge, "name": suite_path.stem}
    out = admin_call(server, key, "POST", "/v1/admin/evals", timeout=timeout_s, json=body)
    results = [EvalResult(**r) for r in out.pop("results")]
    run = EvalRun(**{"actor_name" if k == "actor" else k: v for k, v in out.items()})
    return run, results


def _show_run(run: EvalRun, results: list[EvalResult], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(_out(run, results), indent=2))
        return
    _print_results(results)
    click.echo(_summary(run))


def _summary(run: EvalRun) -> str:
    score = f"{run.score:.3f}" if run.score is not None else "-"
    return (
        f"run {run.id}: {run.model} on {run.suite}: {run.passed}/{run.cases} passed, score {score}"
    )


def _print_results(results: list[EvalResult]) -> None:
    rows = [["CASE", "CATEGORY", "CHECK", "RESULT", "SCORE", "SECONDS", "WHY"]]
    for r in results:
        detail = json.loads(r.detail) if r.detail else {}
        rows.append(
            [
                r.case_id,
                r.category,
                r.check,
                "pass" if r.passed else "FAIL",
                f"{r.score:.2f}",
                f"{r.latency_s:.2f}",
                _why(r, detail),
            ]
        )
    _table(rows)


def _why(r: EvalResult, detail: dict[str, Any]) -> str:
    """What the check found; for a failure with nothing more to say (exact, regex), the
    answer itself, shortened."""
    why = ", ".join(f"{k}={v}" for k, v in detail.items())
    if not why and not r.passed:
        answer = " ".join(r.answer.split())  # one line of the table
        room = WHY_CHARS - len('answer=""')
        if len(answer) > room:
            answer = answer[: room - 1] + "…"
        why = "answer=" + json.dumps(answer, ensure_ascii=False)
    return why[:WHY_CHARS]


def _out(run: EvalRun, results: list[EvalResult]) -> dict[str, Any]:
    return {**run.as_dict(), "results": [r.__dict__ for r in results]}


@eval_group.command("list")
@click.option("--model", default=None, help="Only this model's runs.")
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def list_cmd(ctx: click.Context, model: str | None, limit: int, as_json: bool) -> None:
    """Stored runs, the newest first."""

    async def go(services: OperatorServices) -> list[EvalRun]:
        return await services.eval_runs(model, limit)

    runs = with_services(ctx, go)
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in runs], indent=2))
        return
    rows = [["RUN", "WHEN (UTC)", "MODEL", "SUITE", "PASSED", "SCORE", "BY"]]
    for r in runs:
        rows.append(
            [
                r.id,
                time.strftime("%Y-%m-%d %H:%M", time.gmtime(r.started_at)),
                r.model,
                r.suite,
                f"{r.passed}/{r.cases}",
                f"{r.score:.3f}" if r.score is not None else "-",
                r.actor_name,
            ]
        )
    _table(rows)


@eval_group.command("show")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def show_cmd(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """One run's cases."""

    async def go(services: OperatorServices) -> tuple[EvalRun, list[EvalResult]] | None:
        return await services.eval_run(run_id)

    found = with_services(ctx, go)
    if found is None:
        raise click.ClickException(f"no eval run {run_id!r} (see `chatbox eval list`)")
    run, results = found
    if as_json:
        click.echo(json.dumps(_out(run, results), indent=2))
        return
    _print_results(results)
    click.echo(_summary(run))
