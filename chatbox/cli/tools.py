"""`chatbox tools add | list | mark | remove`: the tools the assistant may call, and the MCP
servers that offer some of them.

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


def _show_tools(rows: list[dict[str, Any]]) -> None:
    table = [["TOOL", "SOURCE", "TIERS", "WORKSPACES", "READ-ONLY"]]
    for r in rows:
        if r["source"] == "builtin":
            read_only = "built-in"
        elif r["read_only"] is None:
            marked = ",".join(r.get("marked_read_only") or ()) or "none"
            read_only = f"marked: {marked} (--check lists its tools)"
        else:
            read_only = "yes" if r["read_only"] else "no: asks the user"
        table.append(
            [
                r["name"],
                r["source"],
                ",".join(r["tiers"]) or "none",
                ",".join(r["workspaces"]),
                read_only,
            ]
        )
    _table(table)


@click.group()
def tools() -> None:
    """The assistant's tools: the built-ins, and MCP servers' offered per tier and workspace."""


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
@click.option("--check", is_flag=True, help="Start each MCP server and list its tools.")
@click.pass_context
def list_tools(ctx: click.Context, as_json: bool, check: bool) -> None:
    """Every tool and where it is offered (tiers whose policy allows tool calls; run_python
    only where it enables the code interpreter), whether an MCP tool is read-only, then the
    MCP servers: how each is reached (secrets are not shown)."""

    async def run(services: OperatorServices) -> dict[str, list[dict[str, Any]]]:
        return await services.tool_catalogue(check)

    found = with_services(ctx, run)
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    _show_tools(found["tools"])
    click.echo()
    if found["servers"]:
        _show(found["servers"], check)
    else:
        click.echo("no MCP servers: add one with `chatbox tools add NAME --command ...`")


@tools.command("mark")
@click.argument("name")
@click.argument("tool_names", metavar="TOOL...", nargs=-1, required=True)
@click.option(
    "--read-only/--not-read-only",
    "read_only",
    required=True,
    help="Read-only tools run without asking; any other waits for the user's approval.",
)
@click.pass_context
def mark(ctx: click.Context, name: str, tool_names: tuple[str, ...], read_only: bool) -> None:
    """Mark tools of MCP server NAME (by the server's names for them) read-only, or not."""
    from chatbox.accounts.audit import cli_actor
    from chatbox.chat.errors import InvalidInput, NotFound

    async def run(services: OperatorServices) -> dict[str, Any]:
        servers = services.mcp_servers()
        try:
            return await servers.mark(cli_actor(), name, tool_names, read_only)
        except (InvalidInput, NotFound) as exc:
            raise click.ClickException(str(exc)) from exc
        finally:
            await servers.close()

    view = with_services(ctx, run)
    click.echo(
        f"MCP server {view['name']}: read-only tools: {', '.join(view['read_only']) or 'none'}"
        " (any other waits for the user's approval)"
    )


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
