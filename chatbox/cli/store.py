"""`chatbox migrate-store`: move a box's SQLite store into PostgreSQL."""

from __future__ import annotations

import click

from chatbox.settings import Settings, settings_from_env


@click.command("migrate-store")
@click.option(
    "--to",
    "url",
    required=True,
    help="The empty PostgreSQL database to copy into (postgresql://user:pass@host/db).",
)
@click.pass_context
def migrate_store(ctx: click.Context, url: str) -> None:
    """Copy the SQLite store of the data directory into PostgreSQL, then verify every table
    by its row count and checksum. Stop chatbox first; afterwards serve with
    CHATBOX_DATABASE_URL (or --database-url) set to the same URL."""
    import asyncio

    from chatbox.services.commandline import migrate_store as run

    settings = ctx.find_object(Settings) or settings_from_env()
    if not url.startswith(("postgresql://", "postgres://")):
        raise click.BadParameter("give a postgresql:// URL", param_hint="--to")
    if not settings.db_path.exists():
        raise click.ClickException(f"no SQLite store at {settings.db_path}")
    try:
        tables = asyncio.run(run(settings, url))
    except ValueError as exc:  # the target already holds a store
        raise click.ClickException(str(exc)) from exc
    width = max(len(t.name) for t in tables)
    for t in tables:
        mark = "ok" if t.ok else "MISMATCH"
        click.echo(f"{t.name:<{width}}  {t.rows:>9}  {t.copied:>9}  {t.checksum}  {mark}")
    bad = [t.name for t in tables if not t.ok]
    if bad:
        raise click.ClickException(f"the copy differs in: {', '.join(bad)}")
    click.echo(f"copied and verified {len(tables)} tables")
