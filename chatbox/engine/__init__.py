"""The inference engine: llama.cpp behind continuous batching and a prefix cache.

Importing this package is cheap; llama.cpp loads only when an engine is created.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from chatbox.engine.types import Engine

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from chatbox.settings import EngineSettings


def create_engine(
    path: Path,
    name: str,
    settings: EngineSettings,
    registry: CollectorRegistry | None = None,
) -> Engine:
    """Load a GGUF as an Engine (call `await engine.start()` before submitting)."""
    from chatbox.engine.engine import LlamaEngine

    return LlamaEngine(path, name, settings, registry)


__all__ = ["create_engine"]
