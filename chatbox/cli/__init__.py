"""The `chatbox` command: a click group that subcommand modules register on."""

from __future__ import annotations

from pathlib import Path

import click

from chatbox import __version__
from chatbox.settings import Settings, settings_from_env


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", "-V", prog_name="chatbox")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Data directory (database, models, files). Env: CHATBOX_DATA_DIR.",
)
@click.option(
    "--database-url",
    default=None,
    help="The store in PostgreSQL (postgresql://user:pass@host/db), as `serve` uses it. "
    "Env: CHATBOX_DATABASE_URL. Default: SQLite in the data directory.",
)
@click.option(
    "--policy",
    "policy_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="The policy file (tiers, limits, routing), as `serve` uses it. "
    "Env: CHATBOX_POLICY_PATH. Default: models/policy.toml.",
)
@click.pass_context
def main(
    ctx: click.Context, data_dir: Path | None, database_url: str | None, policy_path: str | None
) -> None:
    """chatbox: a self-hosted chat appliance."""
    base = ctx.obj if isinstance(ctx.obj, Settings) else settings_from_env()
    try:
        ctx.obj = base.with_overrides(
            data_dir=data_dir, database_url=database_url, policy_path=policy_path
        )
    except ValueError as exc:  # a URL that is not PostgreSQL's: say so, no traceback
        raise click.ClickException(str(exc)) from exc


# -- subcommands -----------------------------------------------------------------------
# Each subcommand module defines a click command/group; register it here with
# main.add_command(...). Keep imports below the group definition, and keep these modules
# light at import (`chatbox --help` loads them all): heavy modules load inside commands.
from chatbox.cli.models import models  # noqa: E402

main.add_command(models)
from chatbox.cli.serve import serve  # noqa: E402

main.add_command(serve)
from chatbox.cli.accounts import keys, usage, users  # noqa: E402

main.add_command(users)
main.add_command(keys)
main.add_command(usage)
from chatbox.cli.audit import audit  # noqa: E402

main.add_command(audit)
from chatbox.cli.data import retention  # noqa: E402  (also adds users/keys commands)

main.add_command(retention)
from chatbox.cli.replicas import replica, replicas  # noqa: E402

main.add_command(replica)
main.add_command(replicas)
from chatbox.cli.moderation import moderation  # noqa: E402

main.add_command(moderation)
from chatbox.cli.workspaces import workspaces  # noqa: E402

main.add_command(workspaces)
from chatbox.cli.shadow import shadow  # noqa: E402

main.add_command(shadow)
from chatbox.cli.prewarm import prewarm  # noqa: E402

main.add_command(prewarm)
from chatbox.cli.doctor import doctor  # noqa: E402

main.add_command(doctor)
from chatbox.cli.store import migrate_store  # noqa: E402

main.add_command(migrate_store)
from chatbox.cli.tools import tools  # noqa: E402

main.add_command(tools)
from chatbox.cli.evals import eval_group  # noqa: E402

main.add_command(eval_group)
from chatbox.cli.canary import canary  # noqa: E402

main.add_command(canary)
