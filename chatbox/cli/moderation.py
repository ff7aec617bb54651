"""`chatbox moderation list | show ID | resolve ID --action dismiss|confirm`: the review queue.

Showing an item (its text) and resolving it are recorded in the audit log as the CLI user."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import click

from chatbox.cli.accounts import _table, with_services

if TYPE_CHECKING:
    from chatbox.services.commandline import OperatorServices


@click.group()
def moderation() -> None:
    """The moderation review queue (flagged and filtered items)."""


@moderation.command("list")
@click.option(
    "--status",
    type=click.Choice(["open", "noted", "dismissed", "confirmed", "all"]),
    default="open",
    show_default=True,
)
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def moderation_list(ctx: click.Context, status: str, limit: int, as_json: bool) -> None:
    """Items newest first, without their text."""
    from chatbox.moderation import item_out

    async def run(services: OperatorServices) -> list[dict[str, Any]]:
        items = await services.review_queue().items(None if status == "all" else status, limit)
        return [item_out(i) for i in items]

    items = with_services(ctx, run)
    if as_json:
        click.echo(json.dumps(items, indent=2))
        return
    rows = [
        ["ID", "WHEN (UTC)", "USER", "TIER", "DIRECTION", "ACTION", "CATEGORY", "SCORE", "STATUS"]
    ]
    rows += [
        [
            i["id"],
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(i["created_at"])),
            i["user"]["name"] or "",
            i["tier"],
            i["direction"],
            i["action"],
            i["category"],
            f"{i['scores'].get(i['category'], 0.0):.2f}",
            i["status"],
        ]
        for i in items
    ]
    _table(rows)


@moderation.command("show")
@click.argument("item_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def moderation_show(ctx: click.Context, item_id: str, as_json: bool) -> None:
    """One item with its text (recorded in the audit log)."""
    from chatbox.accounts.audit import cli_actor
    from chatbox.moderation import item_out

    async def run(services: OperatorServices) -> dict[str, Any] | None:
        item = await services.review_queue().show(cli_actor(), item_id)
        return item_out(item, with_text=True) if item else None

    item = with_services(ctx, run)
    if item is None:
        raise click.ClickException(f"no moderation item {item_id!r}")
    if as_json:
        click.echo(json.dumps(item, indent=2))
        return
    for key in ("id", "tier", "direction", "action", "category", "status", "source"):
        click.echo(f"{key}: {item[key] if item[key] is not None else ''}")
    click.echo(f"user: {item['user']['name'] or ''}")
    click.echo("scores: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(item["scores"].items())))
    click.echo("text:")
    click.echo(item["text"] if item["text"] is not None else "(not kept)")


@moderation.command("resolve")
@click.argument("item_id")
@click.option("--action", type=click.Choice(["dismiss", "confirm"]), required=True)
@click.pass_context
def moderation_resolve(ctx: click.Context, item_id: str, action: str) -> None:
    """Dismiss (a false alarm) or confirm an item (recorded in the audit log)."""
    from chatbox.accounts.audit import cli_actor

    async def run(services: OperatorServices) -> str | None:
        item = await services.review_queue().resolve(cli_actor(), item_id, action)  # type: ignore[arg-type]
        return item.status if item else None

    status = with_services(ctx, run)
    if status is None:
        raise click.ClickException(f"no moderation item {item_id!r}")
    click.echo(f"{item_id}: {status}")
