"""`chatbox doctor`: where a running server's resident memory goes (through its admin API)."""

from __future__ import annotations

import json
from typing import Any

import click

from chatbox.cli.front import admin_call
from chatbox.settings import Settings, settings_from_env


def _mb(n: int) -> str:
    return f"{n / 2**20:,.1f} MB"


def show_memory(report: dict[str, Any]) -> None:
    """The rows, largest first, then their total beside the process's RSS."""
    rss = max(1, report["rss_bytes"])
    rows = [(r["what"], r["bytes"]) for r in report["rows"]]
    rows.append(("other (RSS the mappings do not show)", report["other_bytes"]))
    width = max(len(what) for what, _ in rows)
    click.echo(f"memory of the server process (pid {report['pid']})")
    for what, size in rows:
        click.echo(f"  {what.ljust(width)}  {_mb(size):>12}  {size / rss:6.1%}")
    click.echo(f"  {'total'.ljust(width)}  {_mb(report['total_bytes']):>12}")
    click.echo(f"  {'RSS'.ljust(width)}  {_mb(report['rss_bytes']):>12}")
    click.echo(f"loaded models: {', '.join(report['models']) or 'none'}")
    if report.get("malloc_arenas"):
        click.echo(f"malloc arenas: {report['malloc_arenas']}")


@click.command()
@click.option("--front", default=None, help="The server's URL (env: CHATBOX_FRONT_URL).")
@click.option("--key", default=None, help="An admin's API key (env: CHATBOX_ADMIN_KEY).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def doctor(ctx: click.Context, front: str | None, key: str | None, as_json: bool) -> None:
    """Where a running server's memory goes: weights, KV caches, encoders, libraries, heap."""
    settings = ctx.find_object(Settings) or settings_from_env()
    url = (front or settings.front_url or f"http://{settings.host}:{settings.port}").rstrip("/")
    report = admin_call(url, key or settings.admin_key, "GET", "/v1/admin/memory")
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        show_memory(report)
