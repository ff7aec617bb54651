"""`chatbox canary status|promote|rollback|resume`: each canary arm against its tier's
baseline, and the admin's decisions (a running server applies them at its next check)."""

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
    """Canary models: verdicts per arm, promote, roll back, resume."""


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
        click.echo(
            f"{c['arm']}: {c['model']} on tier {c['tier']} ({c['percent']:g}%): {c['state']}"
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
