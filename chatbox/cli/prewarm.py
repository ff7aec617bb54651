"""`chatbox prewarm status|pin|unpin`: what the pre-warmer has learned, and the models an
admin keeps loaded whatever their hours (every server on the database reads the pins at its
pre-warmer's next step)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import click

from chatbox.cli.accounts import with_services

if TYPE_CHECKING:
    from chatbox.services.commandline import OperatorServices


@click.group()
def prewarm() -> None:
    """Pre-warming: each model's busy hours ahead, and models pinned warm."""


@prewarm.command("status")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def status_cmd(ctx: click.Context, as_json: bool) -> None:
    """The history counted, the pins, and each model's busy hours in the next day (UTC)."""

    async def go(services: OperatorServices) -> dict[str, Any]:
        return await services.prewarm_outlook()

    out = with_services(ctx, go)
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    history, needed = out["history_h"], out["decides_after_h"]
    if history < needed:
        click.echo(
            f"history: {history} h of requests counted; pre-warming loads and unloads by the"
            f" hours from {needed} h on (pins apply now)"
        )
    else:
        click.echo(f"history: {history} h of requests counted")
    for p in out["pins"]:
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(p["at"]))
        click.echo(f"pinned: {p['model']} (by {p['by']}, {when} UTC): kept loaded")
    if not out["pins"]:
        click.echo("pinned: none (the default model is always kept loaded)")
    for m in out["models"]:
        ahead = ", ".join(m["busy_ahead"]) or "none"
        click.echo(
            f"{m['model']}: peak {m['peak']:g} requests/h at {m['peak_at']} UTC;"
            f" busy in the next 24 h: {ahead}"
        )
    click.echo("what a server loaded and why: the console's Pre-warm page")


def _pin(ctx: click.Context, model: str, pin: bool) -> bool:
    from chatbox.accounts.audit import cli_actor

    async def go(services: OperatorServices) -> bool:
        return await services.pin_model(cli_actor(), model, pin)

    try:
        return with_services(ctx, go)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc


@prewarm.command("pin")
@click.argument("model")
@click.pass_context
def pin_cmd(ctx: click.Context, model: str) -> None:
    """Keep MODEL loaded whatever its hours (loaded at the next step if it is not)."""
    if _pin(ctx, model, True):
        click.echo(f"{model}: pinned (a running server loads it at its next step)")
    else:
        click.echo(f"{model}: pinned already")


@prewarm.command("unpin")
@click.argument("model")
@click.pass_context
def unpin_cmd(ctx: click.Context, model: str) -> None:
    """Let MODEL be unloaded again outside its busy hours."""
    if not _pin(ctx, model, False):
        raise click.ClickException(f"{model} is not pinned")
    click.echo(f"{model}: unpinned (unloaded once idle outside its busy hours)")
