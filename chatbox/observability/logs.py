"""Logging: text or JSON lines, each carrying the trace id of the request it belongs to."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from typing import Any

from opentelemetry import trace

FORMATS = ("text", "json")
LEVELS = ("critical", "error", "warning", "info", "debug")
# Loggers whose debug lines show: chatbox's own and the server's. Libraries stay at info, as
# their debug lines carry SQL parameters and payloads, which are user content.
DEBUG_LOGGERS = ("chatbox", "uvicorn")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [trace %(trace_id)s] %(message)s"
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()) | {
    "message",
    "asctime",
    "trace_id",
    "span_id",
    "color_message",  # uvicorn's copy of the message with terminal colour codes
}


# A URL's userinfo (user:password@) and query (?token=...): where a URL carries its secrets.
_URL = re.compile(
    r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^\s/?#@'\"<>]*@)?"
    r"(?P<rest>[^\s?#'\"<>]*)(?P<query>\?[^\s#'\"<>]*)?"
)
# Libraries whose errors carry what a remote server sent (the MCP SDK's loggers): their lines
# say which error it was, never its text or traceback.
QUIET_ERRORS = ("mcp", "client")


def redact_urls(text: str) -> str:
    """`text` with every URL's userinfo (user:password) and query values replaced by ***."""

    def clean(m: re.Match[str]) -> str:
        user = "***@" if m.group("user") is not None else ""  # a bare name may be a token
        query = m.group("query")
        if query is not None:  # keys stay (they say what was sent), values go
            parts = (p.partition("=") for p in query[1:].split("&"))
            query = "?" + "&".join(f"{key}=***" if sep else "***" for key, sep, _ in parts)
        return f"{m.group('scheme')}{user}{m.group('rest')}{query or ''}"

    return _URL.sub(clean, text) if "://" in text else text


class RedactSecrets(logging.Filter):
    """Keeps secrets out of every line: URLs' passwords and query values (an MCP server's
    `?token=`, in the HTTP library's own request lines too), and the text and traceback of
    errors the MCP SDK logs (a server's answer, echoed by a validation error)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.name.split(".")[0] in QUIET_ERRORS:
            exc = record.exc_info[1]
            record.msg = f"{_message(record)} ({type(exc).__name__ if exc else 'error'})"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        message = _message(record)
        clean = redact_urls(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_urls(record.exc_text)
        for key, value in list(vars(record).items()):
            if key not in _STANDARD and isinstance(value, str) and "://" in value:
                setattr(record, key, redact_urls(value))
        return True


# A command-line process configures no handler: Python's last resort prints its warnings
# (an MCP server checked by `chatbox tools add`), through the same filter.
if logging.lastResort is not None:
    logging.lastResort.addFilter(RedactSecrets())


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:  # arguments that do not fit the format: the format alone
        return str(record.msg)


def current_trace_id() -> str | None:
    """The hex trace id of the span current in this context, or None outside any trace."""
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None


class TraceIdFilter(logging.Filter):
    """Adds `trace_id` and `span_id` ("-" outside a trace) to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            record.trace_id = format(ctx.trace_id, "032x")
            record.span_id = format(ctx.span_id, "016x")
        elif not hasattr(record, "trace_id"):
            record.trace_id = "-"
            record.span_id = "-"
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, trace ids, extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        trace_id = getattr(record, "trace_id", "-")
        if trace_id != "-":
            out["trace_id"] = trace_id
            out["span_id"] = getattr(record, "span_id", "-")
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value if isinstance(value, str | int | float | bool) else str(value)
        if record.exc_text:  # already formatted (and cleaned: RedactSecrets)
            out["exception"] = record.exc_text
        elif record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


_configured: list[logging.Handler] = []  # the handler configure_logging installed, if it ran


def notice(logger: logging.Logger, message: str) -> None:
    """Tell whoever started the process: a log line where configure_logging has run (the
    server, whose lines must all be in its format), plain stderr otherwise (a CLI command)."""
    if _configured and _configured[0] in logging.getLogger().handlers:
        logger.warning(message)
    else:
        print(message, file=sys.stderr, flush=True)


def configure_logging(level: str = "info", fmt: str = "text") -> logging.Handler:
    """Send every logger (uvicorn's too) and Python's warnings to stderr in `fmt`, at `level`
    (debug lines from `DEBUG_LOGGERS` only); returns the handler."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}")
    if level.lower() not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}")
    numeric = logging.getLevelNamesMapping()[level.upper()]
    handler = logging.StreamHandler()
    handler.addFilter(TraceIdFilter())
    handler.addFilter(RedactSecrets())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(max(numeric, logging.INFO))
    for name in DEBUG_LOGGERS:
        logging.getLogger(name).setLevel(numeric)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    logging.captureWarnings(True)  # a warning is a log line like any other, in the same format
    # Progress bars (the embedding model's "Loading weights") would write raw lines between them.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    _configured[:] = [handler]
    return handler
