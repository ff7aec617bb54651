"""`chatbox tools add | list | remove`: the MCP servers whose tools the assistant may call.

The CLI is the operator (an admin): each change is recorded in the audit log as
`cli:<OS user>`. A running server picks the change up at its next turn."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from chatbox.cli.accounts import _table, with_services

if TYPE_CHECKING:
    from chatbox.services.commandline import OperatorServices


def _show(rows: list[dict[str, Any]], checked: bool) -> None:
    head = ["NAME", "TRANSPORT", "TARGET", "TIERS", "WORKSPACES", "SECRETS"]
    if checked:
        head += ["STATE", "TOOLS"]
    table = [head]
    for r in rows:
        secrets = [f"env {k}" for k in r["env"]] + [f"header {h}" for h in r["headers"]]
        line = [
            r["name"],
            r["transport"],
            r["target"],
            ",".join(r["tiers"]) or "all",
            ",".join(r["workspaces"]) or "all",
            ", ".join(secrets) or "-",
        ]
        if checked:
            line += [r["state"][:60], ",".join(t["name"] for t in r["tools"]) or "-"]
        table.append(line)
    _table(table)


@click.group()
def tools() -> None:
    """MCP servers: their tools are offered to the assistant per tier and workspace."""


@tools.command("add")
@click.argument("name")
@click.option("--command", default="", help="A stdio server: the command that starts it.")
@click.option("--url", default="", help="A streamable-HTTP server: its endpoint URL.")
@click.option("--tier", "tiers", multiple=True, help="Offer it only to this tier (repeatable).")
@click.option(
    "--workspace", "workspaces", multiple=True, help="Offer it only in this workspace (repeatable)."
)
@click.option("--env", "env", multiple=True, help="NAME=VALUE for a stdio server (repeatable).")
@click.option(
    "--header", "headers", multiple=True, help='"Name: value" for a URL server (repeatable).'
)
@click.option("--no-check", is_flag=True, help="Do not start the server to list its tools.")
@click.pass_context
def add(
    ctx: click.Context,
    name: str,
    command: str,
    url: str,
    tiers: tuple[str, ...],
    workspaces: tuple[str, ...],
    env: tuple[str, ...],
    headers: tuple[str, ...],
    no_check: bool,
) -> None:
    """Add (or replace) an MCP server, then start it once to list its tools."""
    from chatbox.accounts.audit import cli_actor
    from chatbox.chat.errors import InvalidInput

    async def run(services: OperatorServices) -> dict[str, Any]:
        servers = services.mcp_servers()
        try:
            view = await servers.add(
                cli_actor(),
                name,
                command=command,
                url=url,
                env=env,
                headers=headers,
                tiers=tiers,
                workspaces=workspaces,
            )
            if not no_check:
                view = await servers.check(view["name"])
        except InvalidInput as exc:
            raise click.ClickException(str(exc)) from exc
        finally:
            await servers.close()
        return view

    view = with_services(ctx, run)
    click.echo(f"added MCP server {view['name']} ({view['transport']})")
    if not no_check:
        if view["tools"]:
            click.echo("tools: " + ", ".join(t["name"] for t in view["tools"]))
        else:
            click.echo(f"warning: it offers no tools now: {view['state']}")


@tools.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.option("--check", is_flag=True, help="Start each server and list its tools.")
@click.pass_context
def list_servers(ctx: click.Context, as_json: bool, check: bool) -> None:
    """Every MCP server: how it is reached, where it is offered (secrets are not shown)."""

    async def run(services: OperatorServices) -> list[dict[str, Any]]:
        servers = services.mcp_servers()
        try:
            rows = await servers.overview()
            if check:
                rows = [await servers.check(r["name"]) for r in rows]
        finally:
            await servers.close()
        return rows

    rows = with_services(ctx, run)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    elif rows:
        _show(rows, check)
    else:
        click.echo("no MCP servers: add one with `chatbox tools add NAME --command ...`")


@tools.command("remove")
@click.argument("name")
@click.pass_context
def remove(ctx: click.Context, name: str) -> None:
    """Remove an MCP server; its tools are no longer offered."""
    from chatbox.accounts.audit import cli_actor
    from chatbox.chat.errors import NotFound

    async def run(services: OperatorServices) -> None:
        servers = services.mcp_servers()
        try:
            await servers.remove(cli_actor(), name)
        except NotFound as exc:
            raise click.ClickException(str(exc)) from exc
        finally:
            await servers.close()

    with_services(ctx, run)
    click.echo(f"removed MCP server {name}")
