"""Options more than one command takes, declared once."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

F = TypeVar("F", bound=Callable[..., object])


def kv_options(f: F) -> F:
    """--n-parallel, --n-ctx and --n-ctx-per-seq: how the engine's KV cache is shaped."""
    for option in reversed(
        (
            click.option(
                "--n-parallel", type=int, default=None, help="Sequences decoded together."
            ),
            click.option(
                "--n-ctx",
                type=int,
                default=None,
                help="KV cells per model: shared out among the slots' streams (the "
                "default), or the unified pool (CHATBOX_KV_UNIFIED=1).",
            ),
            click.option(
                "--n-ctx-per-seq",
                type=int,
                default=None,
                help="Most tokens one conversation holds (default: --n-ctx over the slots).",
            ),
        )
    ):
        f = option(f)
    return f
