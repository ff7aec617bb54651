"""`chatbox shadow …`: mirror a share of a tier's answers to a candidate model on a running
server (through its admin API, which records each change in the audit log)."""

from __future__ import annotations

import json
from typing import Any

import click

from chatbox.cli.front import admin_call
from chatbox.settings import Settings, settings_from_env


@click.group()
@click.option("--front", default=None, help="The server's URL (env: CHATBOX_FRONT_URL).")
@click.option("--key", default=None, help="An admin's API key (env: CHATBOX_ADMIN_KEY).")
@click.pass_context
def shadow(ctx: click.Context, front: str | None, key: str | None) -> None:
    """Shadow traffic: try a candidate model on real requests without showing its answers."""
    settings = ctx.find_object(Settings) or settings_from_env()
    ctx.meta["front"] = (
        front or settings.front_url or f"http://{settings.host}:{settings.port}"
    ).rstrip("/")
    ctx.meta["key"] = key or settings.admin_key


def _call(ctx: click.Context, method: str, path: str = "", **kwargs: Any) -> Any:
    return admin_call(
        ctx.meta["front"], ctx.meta["key"], method, "/v1/admin/shadow" + path, **kwargs
    )


def _show(status: dict[str, Any]) -> None:
    rules = status["rules"]
    if not rules:
        click.echo("no shadow traffic runs")
    for r in rules:
        click.echo(f"tier {r['tier']}: {r['percent']:g}% mirrored to {r['candidate']}")
    for s in status["summary"]:

        def one(v: float | None, fmt: str) -> str:
            return "-" if v is None else format(v, fmt)

        def pair(a: float | None, b: float | None, fmt: str) -> str:
            return f"{one(a, fmt)} / {one(b, fmt)}"

        click.echo(
            f"  {s['tier']}: {s['served_model']} -> {s['candidate']}: {s['compared']} compared,"
            f" {s['shed']} shed; ttft {pair(s['served_ttft_s'], s['shadow_ttft_s'], '.3f')} s;"
            f" tok/s {pair(s['served_tokens_per_s'], s['shadow_tokens_per_s'], '.1f')};"
            f" tokens {pair(s['served_tokens'], s['shadow_tokens'], '.0f')};"
            f" blocked {pair(s['served_blocked_rate'], s['shadow_blocked_rate'], '.2f')};"
            f" similarity {one(s['similarity'], '.2f')}"
        )


@shadow.command("start")
@click.argument("candidate")
@click.option("--tier", required=True, help="Whose answers to mirror.")
@click.option("--percent", type=float, required=True, help="Share of them (0-100].")
@click.pass_context
def start(ctx: click.Context, candidate: str, tier: str, percent: float) -> None:
    """Mirror PERCENT of TIER's answers to CANDIDATE once each is done."""
    _show(
        _call(
            ctx, "POST", "/start", json={"candidate": candidate, "tier": tier, "percent": percent}
        )
    )


@shadow.command("status")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """The rules and each served model beside its candidate."""
    out = _call(ctx, "GET")
    click.echo(json.dumps(out, indent=2)) if as_json else _show(out)


@shadow.command("stop")
@click.option("--tier", required=True)
@click.pass_context
def stop(ctx: click.Context, tier: str) -> None:
    """Stop mirroring TIER's answers."""
    _show(_call(ctx, "POST", "/stop", json={"tier": tier}))
