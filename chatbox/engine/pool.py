"""EnginePool: the loaded engines of this process, by model name, loaded lazily."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

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

    async def get(self, name: str) -> Engine:
        engine = self._engines.get(name)
        if engine is not None:
            return engine
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            engine = self._engines.get(name)
            if engine is None:
                path = await asyncio.to_thread(self.resolve, name)
                engine = await asyncio.to_thread(
                    self._factory, path, name, self.settings, self.registry
                )
                await engine.start()
                self._engines[name] = engine
        return engine

    def loaded(self) -> list[str]:
        return list(self._engines)

    def stats(self) -> dict[str, EngineStats]:
        out: dict[str, EngineStats] = {}
        for name, engine in self._engines.items():
            stats = getattr(engine, "stats", None)
            out[name] = stats() if callable(stats) else EngineStats()
        return out

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
