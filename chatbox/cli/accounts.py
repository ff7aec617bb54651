"""`chatbox users …`, `chatbox keys …` and `chatbox usage`: accounts without a browser."""

from __future__ import annotations

import json
import secrets
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from chatbox.settings import Settings, settings_from_env

if TYPE_CHECKING:
    from chatbox.accounts import User, UserAdmin
    from chatbox.services.commandline import OperatorServices

T = TypeVar("T")
# chatbox.store.users.ROLES, spelled out so that `chatbox --help` need not load the store
# (tests/cli/test_startup.py checks that they agree).
ROLES = ("admin", "member")


def _settings(ctx: click.Context) -> Settings:
    return ctx.find_object(Settings) or settings_from_env()


def with_services(ctx: click.Context, fn: Callable[[OperatorServices], Awaitable[T]]) -> T:
    """Run fn on the services the command line uses: the database opened (the first admin
    created on an empty one), then closed."""
    import asyncio

    from chatbox.services import StoreElsewhere
    from chatbox.services.commandline import operator_services

    settings = _settings(ctx)

    async def run() -> T:
        async with operator_services(settings) as services:
            return await fn(services)

    try:
        return asyncio.run(run())
    except StoreElsewhere as exc:  # before anything was opened or created
        raise click.ClickException(str(exc)) from exc


def _admin(services: OperatorServices) -> UserAdmin:
    """Account changes as the CLI (no login: `cli:<OS user>`), recorded in the audit log."""
    from chatbox.accounts import cli_actor

    return services.accounts.admin(cli_actor())


async def _person(services: OperatorServices, name: str) -> User:
    user = await services.accounts.by_name(name)
    if user is None:
        raise click.ClickException(f"no user named {name!r} (see `chatbox users list`)")
    return user


def _table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def _tiers(ctx: click.Context) -> list[str]:
    from chatbox.chat.policy import Policy

    return list(Policy.load(_settings(ctx).policy_path).tiers)


def _new_password(password: str | None) -> tuple[str | None, bool]:
    """The given password, a prompted one (on a terminal), or a generated one to print."""
    if password:
        return password, False
    if sys.stdin.isatty():
        entered = click.prompt(
            "Password (empty: generate one)",
            default="",
            hide_input=True,
            confirmation_prompt=True,
            show_default=False,
        )
        if entered:
            return entered, False
    return secrets.token_urlsafe(12), True


# -- users ------------------------------------------------------------------------------


@click.group()
def users() -> None:
    """Manage accounts: add, list, set-tier, set-role, disable, enable, reset-password."""


@users.command("add")
@click.argument("name")
@click.option("--role", type=click.Choice(ROLES), default="member", show_default=True)
@click.option("--tier", default="free", show_default=True, help="A tier from the policy file.")
@click.option("--password", default=None, help="Default: prompt, or generate and print one.")
@click.option("--no-password", is_flag=True, help="API keys only; no browser login.")
@click.option("--key", is_flag=True, help="Also make an API key: printed on stdout, once.")
@click.pass_context
def users_add(
    ctx: click.Context,
    name: str,
    role: str,
    tier: str,
    password: str | None,
    no_password: bool,
    key: bool,
) -> None:
    if tier not in _tiers(ctx):
        raise click.ClickException(f"unknown tier {tier!r}; tiers: {', '.join(_tiers(ctx))}")
    generated = False
    if not no_password:
        password, generated = _new_password(password)

    async def run(services: OperatorServices) -> str | None:
        if await services.accounts.by_name(name) is not None:
            raise click.ClickException(f"a user named {name!r} already exists")
        admin = _admin(services)
        await admin.add_user(name, role=role, tier=tier, password=password)
        if not key:
            return None
        _, secret = await admin.create_key(await _person(services, name), None)
        return secret

    secret = with_services(ctx, run)
    click.echo(f"Added {role} {name!r} on the {tier} tier", err=True)
    if generated:
        click.echo(f"Password: {password}", err=True)
    if secret is not None:
        click.echo(secret)


@users.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def users_list(ctx: click.Context, as_json: bool) -> None:
    found = with_services(ctx, lambda services: services.accounts.users())
    if as_json:
        click.echo(
            json.dumps(
                [
                    {"name": u.name, "role": u.role, "tier": u.tier, "disabled": u.disabled}
                    for u in found
                ],
                indent=2,
            )
        )
        return
    rows = [["NAME", "ROLE", "TIER", "STATUS"]]
    rows += [[u.name, u.role, u.tier, "disabled" if u.disabled else "active"] for u in found]
    _table(rows)


def _update(
    ctx: click.Context, name: str, change: Callable[[UserAdmin, User], Awaitable[Any]], done: str
) -> None:
    async def run(services: OperatorServices) -> None:
        await change(_admin(services), await _person(services, name))

    with_services(ctx, run)
    click.echo(done)


@users.command("set-tier")
@click.argument("name")
@click.argument("tier")
@click.pass_context
def users_set_tier(ctx: click.Context, name: str, tier: str) -> None:
    """Move a user to a tier defined in the policy file (free, paid, …)."""
    if tier not in _tiers(ctx):
        raise click.ClickException(f"unknown tier {tier!r}; tiers: {', '.join(_tiers(ctx))}")
    _update(ctx, name, lambda a, u: a.set_tier(u, tier), f"{name} is now on {tier}")


@users.command("set-role")
@click.argument("name")
@click.argument("role", type=click.Choice(ROLES))
@click.pass_context
def users_set_role(ctx: click.Context, name: str, role: str) -> None:
    _update(ctx, name, lambda a, u: a.set_role(u, role), f"{name} is now {role}")


@users.command("disable")
@click.argument("name")
@click.pass_context
def users_disable(ctx: click.Context, name: str) -> None:
    """Lock a user out at once: sessions end and API keys stop working."""
    _update(ctx, name, lambda a, u: a.set_disabled(u, True), f"{name} is disabled")


@users.command("enable")
@click.argument("name")
@click.pass_context
def users_enable(ctx: click.Context, name: str) -> None:
    _update(ctx, name, lambda a, u: a.set_disabled(u, False), f"{name} is enabled")


@users.command("reset-password")
@click.argument("name")
@click.option("--password", default=None, help="Default: prompt, or generate and print one.")
@click.pass_context
def users_reset_password(ctx: click.Context, name: str, password: str | None) -> None:
    """Set a new password; the user's browser sessions end."""
    new, generated = _new_password(password)
    assert new is not None
    _update(
        ctx,
        name,
        lambda a, u: a.reset_password(u, new, generated),
        f"New password set for {name}" + (f": {new}" if generated else ""),
    )


# -- keys -------------------------------------------------------------------------------


@click.group()
def keys() -> None:
    """API keys (Authorization: Bearer …): create, list, revoke."""


@keys.command("create")
@click.option("--user", "name", required=True, help="The user the key acts as.")
@click.option("--name", "label", default=None, help="A label, e.g. the script using it.")
@click.pass_context
def keys_create(ctx: click.Context, name: str, label: str | None) -> None:
    """Print a new key on stdout (it is shown only this once).

    The key acts as the user and reads their conversations: this is the operator's power
    (admins in the console make keys only for themselves), recorded in the audit log."""

    async def run(services: OperatorServices) -> str:
        user = await _person(services, name)
        _, secret = await _admin(services).create_key(user, label)
        return secret

    click.echo(with_services(ctx, run))


@keys.command("list")
@click.option("--user", "name", default=None)
@click.pass_context
def keys_list(ctx: click.Context, name: str | None) -> None:
    async def run(services: OperatorServices) -> list[list[str]]:
        names = {u.id: u.name for u in await services.accounts.users()}
        user = await _person(services, name) if name else None
        return [
            [
                k.id,
                k.prefix + "…",
                names.get(k.user_id, "?"),
                k.name or "",
                "revoked" if k.revoked_at else "active",
            ]
            for k in await services.accounts.keys(user)
        ]

    _table([["ID", "KEY", "USER", "NAME", "STATUS"], *with_services(ctx, run)])


@keys.command("revoke")
@click.argument("key_id")
@click.pass_context
def keys_revoke(ctx: click.Context, key_id: str) -> None:
    """Revoke a key by its id (or the prefix shown by `keys list`); it stops working at once."""
    if not with_services(ctx, lambda services: _admin(services).revoke_key(key_id.rstrip("…"))):
        raise click.ClickException(f"no active key {key_id!r}")
    click.echo(f"Revoked {key_id}")


# -- usage ------------------------------------------------------------------------------


@click.command()
@click.option("--since", default=None, help="YYYY-MM-DD (default: the start of this month).")
@click.option("--user", "name", default=None)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def usage(ctx: click.Context, since: str | None, name: str | None, as_json: bool) -> None:
    """Requests and tokens per user, model and day (no conversation content)."""
    from chatbox.accounts.usage import month_start

    since = since or month_start()
    report = with_services(ctx, lambda services: services.accounts.usage(since, name))
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    rows = [["DAY", "USER", "MODEL", "ARM", "REQUESTS", "PROMPT", "COMPLETION", "SHED", "DEGRADED"]]
    rows += [
        [
            r["day"],
            r["user"],
            r["model"],
            r["arm"],
            str(r["requests"]),
            str(r["prompt_tokens"]),
            str(r["completion_tokens"]),
            str(r["shed"]),
            str(r["degraded"]),
        ]
        for r in report["data"]
    ]
    _table(rows)
