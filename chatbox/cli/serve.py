"""`chatbox serve`: run the web UI and APIs on one port."""

from __future__ import annotations

import click

from chatbox.cli.options import kv_options
from chatbox.settings import Settings, settings_from_env

GRACEFUL_S = 10


def _check_sign_in_rules(settings: Settings) -> None:
    """Refuse to start on a policy file whose [sign_in] rules have a mistake in them."""
    from chatbox.accounts.sign_in_rules import SignInRules, SignInRulesError

    try:
        SignInRules.load(settings.policy_path)
    except SignInRulesError as exc:
        raise click.ClickException(str(exc)) from exc


@click.command()
@click.option("--host", default=None, help="Address to listen on (default 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Port (default 8000).")
@click.option("--model", default=None, help="Model to serve by default (see `models list`).")
@kv_options
@click.option("--n-batch", type=int, default=None, help="Tokens per decode step.")
@click.option("--threads", "n_threads", type=int, default=None, help="CPU threads (0: all).")
@click.option(
    "--gpu-layers",
    "n_gpu_layers",
    type=int,
    default=None,
    help="Layers offloaded to the GPU (-1: all, where built with GPU support).",
)
@click.option(
    "--flash-attn/--no-flash-attn",
    default=None,
    help="Flash attention (default: chosen for the hardware; on CPU, the faster one, timed).",
)
@click.option(
    "--kv-type",
    type=click.Choice(["f16", "q8_0", "q4_0", "q8_0/f16", "q4_0/f16"]),
    default=None,
    help="KV cache element type, or keys/values apart (default q8_0).",
)
@click.option(
    "--cpu-requant/--no-cpu-requant",
    default=None,
    help="On CPU, serve Q4_1/Q5_1 models as a cached Q8_0 copy, which batches better (default on).",
)
@click.option("--max-tokens", type=int, default=None, help="Default answer length budget.")
@click.option(
    "--database-url",
    default=None,
    help="Keep the store in PostgreSQL (postgresql://user:pass@host/db; env: "
    "CHATBOX_DATABASE_URL) instead of SQLite in the data directory.",
)
@click.option(
    "--database-replica-url",
    default=None,
    help="A streaming replica of --database-url that serves conversation reads "
    "(env: CHATBOX_DATABASE_REPLICA_URL); see docs/scaling.md.",
)
@click.option(
    "--admin-password",
    default=None,
    help="Seed the first admin's password on an empty database "
    "(env: CHATBOX_ADMIN_PASSWORD); without it one is generated and printed.",
)
@click.option(
    "--policy",
    "policy_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Tiers, limits and routing (TOML; default models/policy.toml).",
)
@click.option(
    "--high-water",
    type=int,
    default=None,
    help="Engine queue depth at which free requests are shed (0: slot count).",
)
@click.option(
    "--replica",
    "replicas",
    multiple=True,
    help="A remote engine replica, [openai+]http://host:port[#slots=N&models=a+b] "
    "(repeatable; env: CHATBOX_REPLICAS). See `chatbox replicas --help`.",
)
@click.option(
    "--local/--no-local",
    "local_engine",
    default=None,
    help="Also run models in this process (default on); --no-local: replicas only.",
)
@click.option(
    "--oidc-issuer",
    default=None,
    help="Sign in through this OpenID Connect provider (env: CHATBOX_OIDC_ISSUER); see "
    "docs/admin.md. The client secret is read from CHATBOX_OIDC_CLIENT_SECRET only.",
)
@click.option("--oidc-client-id", default=None, help="This app's client id at the provider.")
@click.option(
    "--oidc-provider-name", default=None, help='Shown as "Sign in with NAME" on the login page.'
)
@click.option(
    "--public-url",
    default=None,
    help="The URL people reach chatbox at (https://chat.example.com): the provider's "
    "redirect URI is PUBLIC_URL/auth/callback.",
)
@click.option(
    "--password-login/--no-password-login",
    default=None,
    help="Local password login for everyone (default), or only for the break-glass admin.",
)
@click.option(
    "--trusted-header-user",
    default=None,
    help="An auth proxy's header naming the person (X-Forwarded-User), believed only from "
    "CHATBOX_TRUSTED_PROXIES; with --trusted-header-groups for their groups.",
)
@click.option("--trusted-header-groups", default=None, help="The proxy's groups header.")
@click.option(
    "--log-level",
    type=click.Choice(["critical", "error", "warning", "info", "debug"], case_sensitive=False),
    default="info",
    show_default=True,
    help="The least severe lines written; debug shows chatbox's own (libraries stay at info).",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one JSON object per line, with the request's trace_id.",
)
@click.pass_context
def serve(ctx: click.Context, /, log_level: str, log_format: str, **flags: object) -> None:
    """Serve the chat UI, the conversation API and the OpenAI-compatible API."""
    import logging

    import uvicorn  # the server and the app load only for this command

    from chatbox.app import create_app
    from chatbox.catalog.registry import RegistryError
    from chatbox.observability.logs import configure_logging
    from chatbox.observability.memory import limit_malloc_arenas
    from chatbox.services import StoreElsewhere, check_store_of
    from chatbox.services.server import model_registry, no_model_message

    base = ctx.find_object(Settings) or settings_from_env()
    flags["replicas"] = flags["replicas"] or None  # none given: keep CHATBOX_REPLICAS
    try:
        settings = base.with_overrides(**flags)
    except ValueError as exc:  # a setting that contradicts another: say which, no traceback
        raise click.ClickException(str(exc)) from exc
    if settings.malloc_arenas > 0:  # before the engines', encoders' and server's threads
        limit_malloc_arenas(settings.malloc_arenas)
    settings.ensure_dirs()
    _check_sign_in_rules(settings)
    try:
        check_store_of(settings)
    except StoreElsewhere as exc:  # say so before anything starts (a new SQLite store)
        raise click.ClickException(str(exc)) from exc
    registry = model_registry(settings)
    try:
        if settings.model:
            registry.get(settings.model)
        elif registry.resolve_default() is None and not settings.replicas:
            raise click.ClickException(no_model_message())
    except RegistryError as exc:
        raise click.ClickException(str(exc)) from exc
    _check_policy(settings)
    configure_logging(log_level, log_format)  # every line carries its request's trace id
    logging.getLogger("chatbox.serve").info(
        "serving on http://%s:%d (data in %s)", settings.host, settings.port, settings.data_dir
    )
    uvicorn.run(
        create_app(settings, registry),
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        log_config=None,  # keep the handlers configured above
        access_log=False,  # chatbox.access writes the one access line, by route template
        # Forwarded headers count only from CHATBOX_TRUSTED_PROXIES (chatbox.web.auth), not
        # from whatever uvicorn trusts by default.
        proxy_headers=False,
        # A SIGTERM waits this long for running answers, then cancels them (stored as
        # interrupted), so a stop never waits on a stream that would run for minutes.
        timeout_graceful_shutdown=GRACEFUL_S,
    )


def _check_policy(settings: Settings) -> None:
    """Refuse to start on a policy file with a mistake in it (an unknown key, tier or value),
    naming the file, the entry and the problem, rather than serving something else."""
    from chatbox.chat.policy import Policy, PolicyError, default_policy_path
    from chatbox.moderation.policy import ModerationPolicy

    path = settings.policy_path or default_policy_path()
    try:
        Policy.load(path)
        ModerationPolicy.load(path)
    except PolicyError as exc:
        raise click.ClickException(str(exc)) from exc
    except (TypeError, ValueError) as exc:
        raise click.ClickException(f"policy file {path}: {exc}") from exc
