"""`chatbox workspaces create | list | add-member | remove-member | delete`: team workspaces.

The CLI is the operator (an admin): each change is recorded in the audit log as
`cli:<OS user>`, naming the workspace (never its content)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import click

from chatbox.cli.accounts import _table, with_services

if TYPE_CHECKING:
    from chatbox.accounts.audit import Actor
    from chatbox.chat.teams.workspaces import Workspace
    from chatbox.services.commandline import OperatorServices


async def _workspace(services: OperatorServices, ref: str) -> Workspace:
    from chatbox.chat.errors import NotFound

    try:
        return await services.workspaces().operator_find(ref)
    except NotFound as exc:
        raise click.ClickException(f"no workspace {ref!r}") from exc


def _operator() -> Actor:
    from chatbox.accounts.audit import cli_actor

    return cli_actor()


@click.group()
def workspaces() -> None:
    """Team workspaces: shared conversations and documents for their members."""


@workspaces.command("create")
@click.argument("name")
@click.option("--owner", "owners", multiple=True, help="A user to make an owner (repeatable).")
@click.option("--system-prompt", default=None, help="The system prompt of its conversations.")
@click.pass_context
def create(
    ctx: click.Context, name: str, owners: tuple[str, ...], system_prompt: str | None
) -> None:
    """A new workspace, with its owners."""
    from chatbox.chat.errors import InvalidInput

    async def run(services: OperatorServices) -> Workspace:
        try:
            return await services.workspaces().operator_create(
                _operator(), name, system_prompt or None, owners
            )
        except InvalidInput as exc:
            raise click.ClickException(str(exc)) from exc

    ws = with_services(ctx, run)
    click.echo(f"created workspace {ws.name} ({ws.id})")


@workspaces.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def list_workspaces(ctx: click.Context, as_json: bool) -> None:
    """Every workspace with its members."""

    async def run(services: OperatorServices) -> list[dict[str, Any]]:
        out = []
        for ws, members in await services.workspaces().operator_overview():
            out.append(
                {
                    "id": ws.id,
                    "name": ws.name,
                    "created_at": ws.created_at,
                    "members": [{"name": m.name, "role": m.role} for m in members],
                }
            )
        return out

    found = with_services(ctx, run)
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    if not found:
        click.echo("no workspaces")
        return
    rows = [["ID", "NAME", "CREATED (UTC)", "OWNERS", "MEMBERS"]]
    for w in found:
        names = {
            r: [m["name"] for m in w["members"] if m["role"] == r] for r in ("owner", "member")
        }
        rows.append(
            [
                w["id"],
                w["name"],
                time.strftime("%Y-%m-%d %H:%M", time.gmtime(w["created_at"])),
                ",".join(names["owner"]) or "-",
                ",".join(names["member"]) or "-",
            ]
        )
    _table(rows)


@workspaces.command("add-member")
@click.argument("workspace")
@click.argument("user")
@click.option("--role", type=click.Choice(["member", "owner"]), default="member", show_default=True)
@click.pass_context
def add_member(ctx: click.Context, workspace: str, user: str, role: str) -> None:
    """Add USER to WORKSPACE (by name or id), or change their role."""

    async def run(services: OperatorServices) -> None:
        from chatbox.chat.errors import InvalidInput, NotFound

        try:
            await services.workspaces().operator_set_member(
                _operator(), workspace, user, "owner" if role == "owner" else "member"
            )
        except NotFound as exc:
            raise click.ClickException(f"no workspace {workspace!r}") from exc
        except InvalidInput as exc:
            raise click.ClickException(str(exc)) from exc

    with_services(ctx, run)
    click.echo(f"{user} is now {'an owner' if role == 'owner' else 'a member'} of {workspace}")


@workspaces.command("remove-member")
@click.argument("workspace")
@click.argument("user")
@click.pass_context
def remove_member(ctx: click.Context, workspace: str, user: str) -> None:
    """Remove USER from WORKSPACE: their access ends at once; what they wrote stays."""

    async def run(services: OperatorServices) -> None:
        from chatbox.chat.errors import NotFound

        ws = await _workspace(services, workspace)
        try:
            await services.workspaces().operator_remove_member(_operator(), ws.id, user)
        except NotFound as exc:
            raise click.ClickException(f"{user} is not a member of {ws.name}") from exc

    with_services(ctx, run)
    click.echo(f"removed {user} from {workspace}")


@workspaces.command("delete")
@click.argument("workspace")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def delete(ctx: click.Context, workspace: str, yes: bool) -> None:
    """Delete WORKSPACE: its conversations and documents are erased, as deleting each would."""
    from chatbox.cli.data import _kv_forget

    if not yes:
        click.confirm(
            f"Erase workspace {workspace} with all its conversations and documents?", abort=True
        )

    forget = _kv_forget(ctx)

    async def run(services: OperatorServices) -> tuple[str, int, int]:
        ws = await _workspace(services, workspace)
        erased = await services.workspaces(forget).erase_workspace(ws.id, _operator())
        return ws.name, erased.conversations, erased.documents

    name, convs, docs = with_services(ctx, run)
    click.echo(f"deleted workspace {name}: {convs} conversations and {docs} documents erased")
