"""What a test that timed out was waiting on: every event loop's pending tasks, each as
the chain of coroutines it is suspended in, printed before pytest-timeout's thread stacks
(a hang in an app under TestClient or a live server sits in a task, not a thread)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = str(Path(__file__).resolve().parent.parent) + "/"


def _chain(coro: Any) -> list[str]:
    """file:line function for each coroutine or generator the task is suspended in."""
    out: list[str] = []
    seen = 0
    while coro is not None and seen < 40:
        seen += 1
        frame: FrameType | None = (
            getattr(coro, "cr_frame", None)
            or getattr(coro, "gi_frame", None)
            or getattr(coro, "ag_frame", None)
        )
        if frame is not None:
            code = frame.f_code
            where = code.co_filename.split("site-packages/")[-1].removeprefix(ROOT)
            out.append(f"{where}:{frame.f_lineno} {code.co_name}")
        coro = (
            getattr(coro, "cr_await", None)
            or getattr(coro, "gi_yieldfrom", None)
            or getattr(coro, "ag_await", None)
        )
    return out


def pending_tasks() -> str:
    """Each running loop's pending tasks and where each waits (best effort: read from
    another thread while the loops run)."""
    lines: list[str] = []
    loops = [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop)]
    for loop in loops:
        if loop.is_closed():
            continue
        try:
            tasks = list(asyncio.all_tasks(loop))
        except RuntimeError:  # the set changed while read
            continue
        lines.append(f"-- loop {id(loop):x}: {len(tasks)} pending tasks")
        for task in tasks:
            lines.append(f"task {task.get_name()}:")
            lines.extend(f"    {where}" for where in _chain(task.get_coro()))
    return "\n".join(lines) + "\n"


def dump_tasks_first(dump_stacks: Callable[[Any], None]) -> Callable[[Any], None]:
    """pytest-timeout's `dump_stacks`, writing the pending tasks first."""

    def dump(terminal: Any) -> None:
        try:
            terminal.sep("~", title="Pending asyncio tasks")
            terminal.write(pending_tasks())
        except Exception as exc:  # a diagnostic must not hide the timeout itself
            terminal.write(f"(could not list the tasks: {exc!r})\n")
        dump_stacks(terminal)

    return dump
