"""`chatbox replica` (serve engines only) and `chatbox replicas …` (a front's replica table)."""

from __future__ import annotations

import json
from typing import Any

import click

from chatbox.cli.front import admin_call
from chatbox.cli.options import kv_options
from chatbox.settings import Settings, settings_from_env


def _settings(ctx: click.Context) -> Settings:
    return ctx.find_object(Settings) or settings_from_env()


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=9001, show_default=True)
@click.option("--model", "models", multiple=True, required=True, help="A model to serve (repeat).")
@click.option("--token", default=None, help="Shared secret (env: CHATBOX_REPLICA_TOKEN).")
@kv_options
@click.option("--threads", "n_threads", type=int, default=None, help="CPU threads (0: all).")
@click.option("--gpu-layers", "n_gpu_layers", type=int, default=None, help="-1: all layers.")
@click.option("--log-level", default="warning", show_default=True)
@click.pass_context
def replica(
    ctx: click.Context,
    /,
    host: str,
    port: int,
    models: tuple[str, ...],
    token: str | None,
    log_level: str,
    **engine: int | None,
) -> None:
    """Serve only engines (no UI, store or accounts) to a front over the replica protocol."""
    import uvicorn

    from chatbox.catalog.registry import RegistryError
    from chatbox.cluster.replica import ReplicaApp, is_loopback, replica_engine_settings
    from chatbox.engine.pool import EnginePool
    from chatbox.observability.memory import limit_malloc_arenas
    from chatbox.services.server import model_registry, serving_files

    settings = _settings(ctx).with_overrides(**engine)
    if settings.malloc_arenas > 0:  # before the engines' threads
        limit_malloc_arenas(settings.malloc_arenas)
    token = token or settings.replica_token
    if not token and not is_loopback(host):
        raise click.ClickException(
            f"refusing to listen on {host} without a token: give --token or "
            "CHATBOX_REPLICA_TOKEN (a replica with no token listens on loopback only)"
        )
    registry = model_registry(settings)
    try:
        for name in models:
            registry.get(name)
    except RegistryError as exc:
        raise click.ClickException(str(exc)) from exc

    pool = EnginePool(serving_files(settings, registry), replica_engine_settings(settings.engine))

    def installed() -> list[str]:  # the models whose files are here (not manifest wishes)
        return [e.name for e in registry.entries(max_age_s=5.0) if e.available]

    app = ReplicaApp(pool, list(models), token, installed=installed)
    click.echo(f"chatbox replica: {', '.join(models)} on http://{host}:{port}")
    uvicorn.run(app, host=host, port=port, log_level=log_level, lifespan="on")


@click.group()
@click.option("--front", default=None, help="The front's URL (env: CHATBOX_FRONT_URL).")
@click.option("--key", default=None, help="An admin's API key (env: CHATBOX_ADMIN_KEY).")
@click.pass_context
def replicas(ctx: click.Context, front: str | None, key: str | None) -> None:
    """A running front's replicas: list, add, remove, drain (through its admin API)."""
    settings = _settings(ctx)
    ctx.meta["front"] = (
        front or settings.front_url or f"http://{settings.host}:{settings.port}"
    ).rstrip("/")
    ctx.meta["key"] = key or settings.admin_key


def _call(ctx: click.Context, method: str, **kwargs: Any) -> Any:
    path = "/v1/admin/replicas" + kwargs.pop("path", "")
    return admin_call(ctx.meta["front"], ctx.meta["key"], method, path, **kwargs)


def _show(rows: list[dict[str, Any]]) -> None:
    head = ["URL", "KIND", "STATE", "MODELS", "RUNNING", "QUEUED", "HIT RATE", "LAST ERROR"]
    table = [head]
    for r in rows:
        rate = "-" if r["prefix_hit_rate"] is None else f"{r['prefix_hit_rate']:.0%}"
        table.append(
            [
                r["url"],
                r["kind"],
                r["state"],
                ",".join(r["models"]) or "-",
                str(r["running"]),
                str(r["queued"]),
                rate,
                (r["last_error"] or "")[:60],
            ]
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


@replicas.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def list_replicas(ctx: click.Context, as_json: bool) -> None:
    """Each replica's state, models, running/queued answers, prefix hit rate, last error."""
    rows = _call(ctx, "GET")["replicas"]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    elif rows:
        _show(rows)
    else:
        click.echo("no replicas: this front runs every model itself")


@replicas.command("add")
@click.argument("url")
@click.option("--kind", type=click.Choice(["chatbox", "openai"]), default="chatbox")
@click.option("--slots", type=int, default=0, help="Answers at once (an OpenAI server's).")
@click.option("--model", "models", multiple=True, help="name or name=server-id (openai kind).")
@click.pass_context
def add(ctx: click.Context, url: str, kind: str, slots: int, models: tuple[str, ...]) -> None:
    """Add a replica (kept in the front's database)."""
    body = {"url": url, "kind": kind, "slots": slots, "models": list(models)}
    _show([_call(ctx, "POST", json=body)])


@replicas.command("remove")
@click.argument("url")
@click.pass_context
def remove(ctx: click.Context, url: str) -> None:
    """Remove a replica."""
    _call(ctx, "DELETE", params={"url": url})
    click.echo(f"removed {url}")


@replicas.command("drain")
@click.argument("url")
@click.option("--undo", is_flag=True, help="Take new work again.")
@click.pass_context
def drain(ctx: click.Context, url: str, undo: bool) -> None:
    """Stop new work on a replica; its running answers finish."""
    _show([_call(ctx, "POST", path="/drain", json={"url": url, "undo": undo})])
