"""`chatbox workspaces create | list | add-member | remove-member | delete`: team workspaces.

The CLI is the operator (an admin): each change is recorded in the audit log as
`cli:<OS user>`, naming the workspace (never its content)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import click

from chatbox.cli.accounts import _table, with_store

if TYPE_CHECKING:
    from chatbox.store import Store, User
    from chatbox.store.workspaces import Workspace


async def _workspace(store: Store, ref: str) -> Workspace:
    ws = await store.workspaces.get(ref)
    if ws is None:
        raise click.ClickException(f"no workspace {ref!r}")
    return ws


async def _user(store: Store, name: str) -> User:
    person = await store.users.get_by_name(name)
    if person is None or person.disabled:
        raise click.ClickException(f"no user named {name!r}")
    return person


async def _audit(store: Store, action: str, target: User | None = None, **detail: Any) -> None:
    from chatbox.accounts.audit import AuditLog, cli_actor

    await AuditLog(store).record(cli_actor(), action, target, **detail)


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
    from chatbox.chat.workspaces import valid_name

    async def run(store: Store) -> Workspace:
        try:
            clean = valid_name(name)
        except InvalidInput as exc:
            raise click.ClickException(str(exc)) from exc
        if await store.workspaces.get(clean) is not None:
            raise click.ClickException(f"a workspace named {clean!r} exists")
        people = [await _user(store, o) for o in owners]  # all known before anything is made
        ws = await store.workspaces.create(clean, system_prompt or None)
        await _audit(store, "workspace.create", workspace=ws.id, name=ws.name)
        for person in people:
            await store.workspaces.set_member(ws.id, person.id, "owner")
            await _audit(store, "workspace.add_member", person, workspace=ws.id, role="owner")
        return ws

    ws = with_store(ctx, run)
    click.echo(f"created workspace {ws.name} ({ws.id})")


@workspaces.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def list_workspaces(ctx: click.Context, as_json: bool) -> None:
    """Every workspace with its members."""

    async def run(store: Store) -> list[dict[str, Any]]:
        out = []
        for ws in await store.workspaces.list():
            members = await store.workspaces.members(ws.id)
            out.append(
                {
                    "id": ws.id,
                    "name": ws.name,
                    "created_at": ws.created_at,
                    "members": [{"name": m.name, "role": m.role} for m in members],
                }
            )
        return out

    found = with_store(ctx, run)
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

    async def run(store: Store) -> None:
        ws = await _workspace(store, workspace)
        person = await _user(store, user)
        await store.workspaces.set_member(
            ws.id, person.id, "owner" if role == "owner" else "member"
        )
        await _audit(store, "workspace.add_member", person, workspace=ws.id, role=role)

    with_store(ctx, run)
    click.echo(f"{user} is now {'an owner' if role == 'owner' else 'a member'} of {workspace}")


@workspaces.command("remove-member")
@click.argument("workspace")
@click.argument("user")
@click.pass_context
def remove_member(ctx: click.Context, workspace: str, user: str) -> None:
    """Remove USER from WORKSPACE: their access ends at once; what they wrote stays."""

    async def run(store: Store) -> None:
        ws = await _workspace(store, workspace)
        person = await _user(store, user)
        if not await store.workspaces.remove_member(ws.id, person.id):
            raise click.ClickException(f"{user} is not a member of {ws.name}")
        await _audit(store, "workspace.remove_member", person, workspace=ws.id)

    with_store(ctx, run)
    click.echo(f"removed {user} from {workspace}")


@workspaces.command("delete")
@click.argument("workspace")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def delete(ctx: click.Context, workspace: str, yes: bool) -> None:
    """Delete WORKSPACE: its conversations and documents are erased, as deleting each would."""
    from chatbox.chat.workspaces import Workspaces
    from chatbox.store.erasure import ErasureRepo

    if not yes:
        click.confirm(
            f"Erase workspace {workspace} with all its conversations and documents?", abort=True
        )

    async def run(store: Store) -> tuple[str, int, int]:
        ws = await _workspace(store, workspace)

        async def erase(user_id: str, ids: Any) -> Any:
            return await ErasureRepo(store.db).conversations(user_id, ids)

        erased = await Workspaces(store, erase).erase_workspace(ws.id)
        await _audit(
            store,
            "workspace.delete",
            workspace=ws.id,
            name=ws.name,
            conversations=erased.conversations,
            documents=erased.documents,
        )
        return ws.name, erased.conversations, erased.documents

    name, convs, docs = with_store(ctx, run)
    click.echo(f"deleted workspace {name}: {convs} conversations and {docs} documents erased")
