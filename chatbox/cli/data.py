"""`chatbox retention run`, `chatbox users delete|export|set-retention` and
`chatbox keys set-retention`: users' data from the command line, each admin action recorded
in the audit log."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from chatbox.cli.accounts import (
    _person,
    _settings,
    keys,
    users,
    with_services,
)

if TYPE_CHECKING:
    from chatbox.services.commandline import OperatorServices

RETENTION_CHOICES = click.Choice(["none", "default"])


def _kv_dir(ctx: click.Context) -> Path:
    settings = _settings(ctx)
    return settings.engine.kv_dir or settings.data_dir / "kv"


def _kv_forget(ctx: click.Context) -> Any:
    from chatbox.services.server import kv_files_forget

    return kv_files_forget(_kv_dir(ctx))


@click.group()
def retention() -> None:
    """Erase conversations idle past their tier's `retention_days` (models/policy.toml)."""


@retention.command("run")
@click.option("--dry-run", is_flag=True, help="Only list what would be erased.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def retention_run(ctx: click.Context, dry_run: bool, as_json: bool) -> None:
    """Erase (or, with --dry-run, list) the conversations past their tier's retention."""
    from chatbox.accounts import cli_actor

    forget = _kv_forget(ctx)

    async def run(services: OperatorServices) -> Any:
        return await services.run_retention(cli_actor(), dry_run, forget)

    report = with_services(ctx, run)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
        return
    for e in report.expired:
        c = e.conversation
        click.echo(f"{c.id}  {c.user_name}  tier {e.tier}: idle past {e.days} days")
    verb = "would erase" if dry_run else "erased"
    count = len(report.expired) if dry_run else report.erased.conversations
    click.echo(f"{verb} {count} conversation(s)", err=True)
    if report.unfinished:
        how = "would be finished" if dry_run else "finished"
        click.echo(f"{report.unfinished} earlier deletion(s) {how}", err=True)


@users.command("delete")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask; erase at once.")
@click.pass_context
def users_delete(ctx: click.Context, name: str, yes: bool) -> None:
    """Erase an account and everything it owns (usage counts stay, nameless)."""
    if not yes and not click.confirm(f"Erase {name!r} and all of its data for good?"):
        raise click.ClickException("nothing was deleted")
    from chatbox.accounts import cli_actor
    from chatbox.services.server import kv_scope_forget

    forget, forget_scope = _kv_forget(ctx), kv_scope_forget(_kv_dir(ctx))

    async def run(services: OperatorServices) -> Any:
        user = await _person(services, name)
        return await services.erase_account(cli_actor(), user, forget, forget_scope)

    erased = with_services(ctx, run)
    click.echo(
        f"Erased {name!r}: {erased.conversations} conversation(s), {erased.documents} "
        f"document(s), {erased.memories} memory fact(s)",
        err=True,
    )


@users.command("export")
@click.argument("name")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The zip to write (default: chatbox-NAME.zip here; '-' for stdout).",
)
@click.pass_context
def users_export(ctx: click.Context, name: str, output: Path | None) -> None:
    """Export an account's data (for a user who lost access); recorded in the audit log."""
    from chatbox.accounts import cli_actor

    async def run(services: OperatorServices) -> bytes:
        return await services.export_account(cli_actor(), await _person(services, name))

    body = with_services(ctx, run)
    if output is not None and str(output) == "-":
        sys.stdout.buffer.write(body)
        return
    path = output or Path(f"chatbox-{name}.zip")
    path.write_bytes(body)
    path.chmod(0o600)  # it holds someone's conversations
    click.echo(f"Wrote {path} ({len(body):,} bytes)", err=True)


@users.command("set-retention")
@click.argument("name")
@click.argument("mode", type=RETENTION_CHOICES)
@click.pass_context
def users_set_retention(ctx: click.Context, name: str, mode: str) -> None:
    """`none`: the account stores no content (temporary chats only); `default`: its tier's."""
    from chatbox.accounts import cli_actor

    async def run(services: OperatorServices) -> None:
        await services.set_retention(cli_actor(), await _person(services, name), mode)

    with_services(ctx, run)
    click.echo(f"{name!r}: retention {mode}", err=True)


@keys.command("set-retention")
@click.argument("key_id")
@click.argument("mode", type=RETENTION_CHOICES)
@click.pass_context
def keys_set_retention(ctx: click.Context, key_id: str, mode: str) -> None:
    """`none`: requests with this key store no content; `default`: as its user's."""
    from chatbox.accounts import cli_actor

    async def run(services: OperatorServices) -> None:
        if not await services.set_key_retention(cli_actor(), key_id, mode):
            raise click.ClickException(f"no active key {key_id!r} (see `chatbox keys list`)")

    with_services(ctx, run)
    click.echo(f"key {key_id}: retention {mode}", err=True)
