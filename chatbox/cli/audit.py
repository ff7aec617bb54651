"""`chatbox audit list`: the append-only log of admin actions (who, what, on whom, when)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import click

from chatbox.cli.accounts import _table, with_services

if TYPE_CHECKING:
    from chatbox.services.commandline import OperatorServices


@click.group()
def audit() -> None:
    """The audit log of admin actions (append-only; never holds content or secrets)."""


@audit.command("list")
@click.option(
    "--limit",
    type=click.IntRange(1, 10_000),
    default=50,
    show_default=True,
    help="The newest N entries.",
)
@click.option("--user", "name", default=None, help="Only actions on this user.")
@click.option("--action", default=None, help="Only this action, e.g. user.set_role.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def audit_list(
    ctx: click.Context, limit: int, name: str | None, action: str | None, as_json: bool
) -> None:
    """The newest entries first."""
    from chatbox.accounts.audit import entry_out

    async def run(services: OperatorServices) -> list[dict[str, Any]]:
        target = await services.accounts.by_name(name) if name else None
        if name and target is None:
            raise click.ClickException(f"no user named {name!r} (see `chatbox users list`)")
        found = await services.accounts.audit_log(limit, target=target, action=action)
        return [entry_out(e) for e in found]

    entries = with_services(ctx, run)
    if as_json:
        click.echo(json.dumps(entries, indent=2))
        return
    rows = [["ID", "WHEN (UTC)", "ACTOR", "ACTION", "TARGET", "DETAIL"]]
    rows += [
        [
            str(e["id"]),
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(e["at"])),
            e["actor"]["name"],
            e["action"],
            (e["target"] or {}).get("name") or "",
            json.dumps(e["detail"], sort_keys=True) if e["detail"] else "",
        ]
        for e in entries
    ]
    _table(rows)
