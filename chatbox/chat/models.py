"""Which models a turn may use; the app wires this to the registry and the engine pool."""

from __future__ import annotations

from typing import Protocol

from chatbox.engine.types import Engine


class ModelProvider(Protocol):
    def names(self) -> list[str]:
        """Models that can be used now."""
        ...

    def default(self) -> str: ...

    async def engine(self, name: str) -> Engine:
        """The loaded engine for a model (loading it on first use)."""
        ...
