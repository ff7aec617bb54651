"""`chatbox canary status|start|stop|promote|rollback|resume`: each canary arm against its
tier's baseline, canaries started and stopped at run time, and the admin's decisions (a
running server applies each at its next check)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import click

from chatbox.cli.accounts import with_services

if TYPE_CHECKING:
    from chatbox.services.commandline import OperatorServices


@click.group()
def canary() -> None:
    """Canary models: start and stop, verdicts per arm, promote, roll back, resume."""


@canary.command("status")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def status_cmd(ctx: click.Context, as_json: bool) -> None:
    """Each canary: its state, the server's newest verdict and its metrics."""

    async def go(services: OperatorServices) -> list[dict[str, Any]]:
        return await services.canary_status()

    found = with_services(ctx, go)
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    if not found:
        click.echo("no canary is configured ([[routing.canary]] in the policy file)")
        return
    for c in found:
        started = f", started by {c['started_by']}" if c.get("started_by") else ""
        click.echo(
            f"{c['arm']}: {c['model']} on tier {c['tier']} ({c['percent']:g}%{started}):"
            f" {c['state']}"
        )
        if c["decided_at"]:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(c["decided_at"]))
            click.echo(f"  decided {when} UTC by {c['decided_by']}: {c['decision_reason']}")
        v = c["verdict"]
        if not v:
            click.echo("  verdict: none yet (the server computes one every few seconds)")
            continue
        click.echo(f"  verdict: {v['verdict']}: {v['reason']}")
        if v.get("more_needed") and "more answers a side" not in v["reason"]:
            click.echo(f"  needs ~{v['more_needed']} more answers a side to decide")
        for m in v["metrics"]:
            # Percentages for ratios, points for rates (a verdict stored before these were
            # kept shows the raw difference).
            low, high = m.get("shown_interval") or [f"{x:+.4g}" for x in m["interval"]]
            worse = m.get("shown") or f"{m['worsening']:+.4g}"
            click.echo(
                f"    {m['metric']:<14} canary n={m['arm']['n']:<6} mean={m['arm']['mean']:<10.4g}"
                f" baseline n={m['baseline']['n']:<6} mean={m['baseline']['mean']:<10.4g}"
                f" worse by {worse} [{low}, {high}] {m['outcome']}"
            )


@canary.command("start")
@click.argument("model")
@click.option("--tier", required=True, help="Whose answers the canary takes a share of.")
@click.option("--percent", type=float, required=True, help="The share, more than 0 up to 100.")
@click.option("--arm", default=None, help="The arm's name (default: canary-MODEL).")
@click.option("--reason", default="", help="Why (kept in the audit log).")
@click.pass_context
def start_cmd(
    ctx: click.Context, model: str, tier: str, percent: float, arm: str | None, reason: str
) -> None:
    """Send PERCENT of TIER's answers to MODEL, beside the policy file's canaries, with no
    restart: every server on this database starts it at its next check."""
    from chatbox.accounts.audit import cli_actor

    async def go(services: OperatorServices) -> str:
        started = await services.canaries().start_canary(
            cli_actor(), model, tier, percent, await services.installed_models(), arm, reason
        )
        return started.arm

    try:
        name = with_services(ctx, go)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(
        f"{name}: {model} takes {percent:g}% of tier {tier}'s answers"
        " (a running server starts it at its next check)"
    )


@canary.command("stop")
@click.argument("arm")
@click.option("--reason", default="", help="Why (kept in the audit log).")
@click.pass_context
def stop_cmd(ctx: click.Context, arm: str, reason: str) -> None:
    """Stop a canary started with `chatbox canary start`: its arm gets no more answers."""
    from chatbox.accounts.audit import cli_actor

    async def go(services: OperatorServices) -> None:
        await services.canaries().stop_canary(cli_actor(), arm, reason)

    try:
        with_services(ctx, go)
    except LookupError as exc:
        raise click.ClickException(str(exc).strip("'\"")) from exc
    click.echo(f"{arm}: stopped (a running server stops it at its next check)")


def _decide(ctx: click.Context, arm: str, action: str, reason: str) -> None:
    from chatbox.accounts.audit import cli_actor

    async def go(services: OperatorServices) -> None:
        canaries = services.canaries()
        decide = {
            "promote": canaries.promote,
            "rollback": canaries.rollback,
            "resume": canaries.resume,
        }[action]
        await decide(cli_actor(), arm, reason)

    try:
        with_services(ctx, go)
    except LookupError as exc:
        raise click.ClickException(str(exc).strip("'\"")) from exc
    click.echo(f"{arm}: {action} recorded (a running server applies it at its next check)")


@canary.command("promote")
@click.argument("arm")
@click.option("--reason", default="", help="Why (kept in the audit log).")
@click.pass_context
def promote_cmd(ctx: click.Context, arm: str, reason: str) -> None:
    """Make the canary's model its tier's model (until the policy file names one)."""
    _decide(ctx, arm, "promote", reason)


@canary.command("rollback")
@click.argument("arm")
@click.option("--reason", default="", help="Why (kept in the audit log).")
@click.pass_context
def rollback_cmd(ctx: click.Context, arm: str, reason: str) -> None:
    """Send none of the tier to the canary any more."""
    _decide(ctx, arm, "rollback", reason)


@canary.command("resume")
@click.argument("arm")
@click.option("--reason", default="", help="Why (kept in the audit log).")
@click.pass_context
def resume_cmd(ctx: click.Context, arm: str, reason: str) -> None:
    """Send the canary its share again, its samples counted afresh from now."""
    _decide(ctx, arm, "resume", reason)
