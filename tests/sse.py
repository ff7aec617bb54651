"""A small SSE reader for tests: what a browser's EventSource would see."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass
class Event:
    id: str | None
    event: str
    data: str

    def json(self) -> Any:
        return json.loads(self.data)


def parse_sse(lines: Iterator[str]) -> Iterator[Event]:
    """Yield events from an iterator of text lines (comments are skipped)."""
    ident, kind, data = None, "message", []
    for line in lines:
        if line == "":
            if data:
                yield Event(ident, kind, "\n".join(data))
            ident, kind, data = None, "message", []
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "id":
                ident = value
            elif field == "event":
                kind = value
            elif field == "data":
                data.append(value)
