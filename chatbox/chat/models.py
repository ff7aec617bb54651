"""Which models a turn may use; the app wires this to the registry and the engine pool."""

from __future__ import annotations

from typing import Protocol

from chatbox.chat.errors import UnknownModel
from chatbox.engine.types import Engine, EngineStats

AUTO = "auto"  # let routing pick the model by the request's shape


class ModelProvider(Protocol):
    def names(self) -> list[str]:
        """Models that can be used now."""
        ...

    def default(self) -> str: ...

    async def engine(self, name: str) -> Engine:
        """The loaded engine for a model (loading it on first use)."""
        ...

    def stats(self, name: str) -> EngineStats | None:
        """A loaded engine's load now (None while it is not loaded)."""
        ...

    def holds_kv(self, name: str) -> bool:
        """Whether an engine of the model may hold conversations' KV now (a loaded local
        one; any replica that reported the model, even while none takes new work)."""
        ...


def resolve_model(models: ModelProvider, requested: str | None) -> str:
    """The installed model a request names (default: the default model), or UnknownModel."""
    names = models.names()
    name = requested or models.default()
    if name == AUTO:
        return AUTO
    if name not in names:
        raise UnknownModel(name, names)
    return name
