"""A store outage is one line in the log, whichever logger reports it; other errors keep
their traceback."""

from __future__ import annotations

import io
import logging

import asyncpg

from chatbox.store.outage import quiet_outages, unreachable


def _logged(exc: BaseException) -> str:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    quiet_outages(handler)
    quiet_outages(handler)  # once is enough: a second call adds nothing
    assert len(handler.filters) == 1
    log = logging.getLogger("chatbox.some.background.task")
    log.addHandler(handler)
    try:
        try:
            raise exc
        except BaseException:
            log.exception("the sweep failed; it will run again")
    finally:
        log.removeHandler(handler)
    return out.getvalue()


def test_an_outage_logged_by_any_task_is_one_line_with_its_reason() -> None:
    try:
        try:
            raise asyncpg.CannotConnectNowError("the database system is starting up")
        except asyncpg.CannotConnectNowError as cause:
            raise RuntimeError("sweep step") from cause
    except RuntimeError as wrapped:
        exc = wrapped
    assert unreachable(exc) == "the database is starting up or shutting down"
    text = _logged(exc)
    assert text.strip().splitlines() == [
        "the sweep failed; it will run again (the database is starting up or shutting down)"
    ]


def test_any_other_error_keeps_its_traceback() -> None:
    text = _logged(ValueError("a bug"))
    assert "Traceback" in text and "ValueError: a bug" in text
