"""EnginePool: the loaded engines of this process, by model name, loaded lazily."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from chatbox.engine.types import Engine, EngineStats
from chatbox.settings import EngineSettings

EngineFactory = Callable[[Path, str, EngineSettings, CollectorRegistry], Engine]


def _default_factory(
    path: Path, name: str, settings: EngineSettings, registry: CollectorRegistry
) -> Engine:
    from chatbox.engine.engine import LlamaEngine

    return LlamaEngine(path, name, settings, registry)


class EnginePool:
    """Holds one started engine per model name; `await pool.get(name)` loads on first use.

    `resolve` maps a model name to its GGUF path (it may be slow: it runs in a thread).
    Metrics of all engines go to `registry` (labelled by model).
    """

    def __init__(
        self,
        resolve: Callable[[str], Path],
        settings: EngineSettings,
        registry: CollectorRegistry | None = None,
        factory: EngineFactory | None = None,
    ) -> None:
        self.resolve = resolve
        self.settings = settings
        self.registry = registry if registry is not None else CollectorRegistry()
        self._factory = factory or _default_factory
        self._engines: dict[str, Engine] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._waiting: dict[str, int] = {}  # callers waiting for a model to load, by name
        self._failed: dict[str, str] = {}  # the last load's error, until one succeeds

    async def get(self, name: str) -> Engine:
        engine = self._engines.get(name)
        if engine is not None:
            return engine
        lock = self._locks.setdefault(name, asyncio.Lock())
        self._waiting[name] = self._waiting.get(name, 0) + 1
        try:
            async with lock:
                engine = self._engines.get(name)
                if engine is None:
                    engine = await self._load(name)
        finally:
            self._waiting[name] -= 1
        return engine

    async def _load(self, name: str) -> Engine:
        try:
            path = await asyncio.to_thread(self.resolve, name)
            engine = await asyncio.to_thread(
                self._factory, path, name, self.settings, self.registry
            )
            await engine.start()
        except Exception as exc:
            self._failed[name] = str(exc) or type(exc).__name__
            raise
        self._failed.pop(name, None)
        self._engines[name] = engine
        return engine

    def loaded(self) -> list[str]:
        return list(self._engines)

    def state(self, name: str) -> str:
        """ "loaded", "loading", "failed: <why>" or "not loaded"."""
        if name in self._engines:
            return "loaded"
        if self._waiting.get(name):
            return "loading"
        if name in self._failed:
            return f"failed: {self._failed[name]}"
        return "not loaded"

    def waiting(self, name: str) -> int:
        """Callers (sends, the preload) waiting for this model to load."""
        return self._waiting.get(name, 0)

    def stats(self) -> dict[str, EngineStats]:
        out: dict[str, EngineStats] = {}
        for name, engine in self._engines.items():
            stats = getattr(engine, "stats", None)
            out[name] = stats() if callable(stats) else EngineStats()
        return out

    def memory(self) -> dict[str, dict[str, Any]]:
        """Each loaded engine's weights file, KV cache and parked KV (Engine.memory)."""
        out: dict[str, dict[str, Any]] = {}
        for name, engine in self._engines.items():
            report = getattr(engine, "memory", None)
            if callable(report):
                out[name] = report()
        return out

    async def retune(self) -> None:
        """Every loaded engine's thread tuner starts its measurements afresh."""
        for engine in list(self._engines.values()):
            retune = getattr(engine, "retune", None)
            if callable(retune):
                await retune()

    async def unload(self, name: str) -> None:
        engine = self._engines.pop(name, None)
        if engine is not None:
            await _close(engine)

    async def stop_all(self) -> None:
        engines, self._engines = list(self._engines.values()), {}
        for engine in engines:
            await _close(engine)


async def _close(engine: Engine) -> None:
    await engine.stop()
    close = getattr(engine, "close", None)
    if callable(close):
        await asyncio.to_thread(close)
