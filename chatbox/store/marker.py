"""The note a data directory keeps of a store that lives in PostgreSQL.

`chatbox serve` on PostgreSQL writes it; a process on that directory without a PostgreSQL
URL is refused instead of making an empty SQLite store beside the real one (a user "added"
there would be added nowhere anyone looks).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

_HEAD = (
    "# chatbox: this data directory's store is in PostgreSQL (written by `chatbox serve`).\n"
    "# Commands on it need CHATBOX_DATABASE_URL or --database-url; delete this file to keep a\n"
    "# SQLite store here instead.\n"
)


class StoreElsewhere(Exception):
    """The data directory's store is in PostgreSQL, and no URL to it was given."""


def without_password(url: str) -> str:
    """`url` with any password left out (the rest of it names the database)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 address goes back in brackets
        host = f"[{host}]"
    netloc = f"{parts.username or ''}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def note_postgresql(marker: Path, url: str) -> None:
    """Write (or refresh) the note that this directory's store is the database at `url`."""
    text = _HEAD + without_password(url) + "\n"
    with contextlib.suppress(FileNotFoundError):
        if marker.read_text() == text:
            return
    fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def noted_postgresql(marker: Path) -> str | None:
    """The database (without its password) the note names; None where there is no note."""
    try:
        text = marker.read_text()
    except FileNotFoundError:
        return None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    names = [line for line in lines if not line.startswith("#")]
    return names[0] if names else "PostgreSQL"


def check_store(marker: Path, database: Path | str) -> None:
    """Refuse a SQLite store in a directory whose store is in PostgreSQL."""
    if isinstance(database, str):
        return
    noted = noted_postgresql(marker)
    if noted is not None:
        raise StoreElsewhere(
            f"the store of {marker.parent} is in PostgreSQL ({noted}), as {marker.name} "
            "there says: set CHATBOX_DATABASE_URL or pass --database-url with its URL "
            f"(password included); delete {marker} to keep a new SQLite store there instead"
        )
