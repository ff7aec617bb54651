"""The console's models: what is installed (with GGUF facts), loaded, the default per tier,
and the admin's changes (load, unload, set the default, add a file already on the server),
each recorded in the audit log."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from chatbox.accounts import AuditLog
from chatbox.catalog.gguf import InvalidModelFile, read_model_file
from chatbox.catalog.registry import ModelRegistry, RegistryError
from chatbox.chat.policy import Policy
from chatbox.engine.pool import EnginePool
from chatbox.store import User


class ModelAdminError(ValueError):
    """A change that cannot be made (a clear 4xx; nothing changed)."""


class ModelAdmin:
    def __init__(
        self, registry: ModelRegistry, pool: EnginePool, policy: Policy, audit: AuditLog
    ) -> None:
        self.registry = registry
        self.pool = pool
        self.policy = policy
        self.audit = audit
        self._facts: dict[tuple[str, float], dict[str, Any]] = {}  # (path, mtime) -> facts

    def _gguf(self, path: str) -> dict[str, Any]:
        p = Path(path)
        try:
            key = (path, p.stat().st_mtime)
        except OSError:
            return {}
        facts = self._facts.get(key)
        if facts is None:
            try:
                info = read_model_file(p)
            except InvalidModelFile as exc:
                return {"error": str(exc)}
            facts = {
                "architecture": info.architecture,
                "parameters": info.parameter_count,
                "quantization": info.quantization,
                "context_length": info.context_length,
                "size_bytes": info.size_bytes,
                "has_chat_template": bool(info.chat_template),
            }
            self._facts[key] = facts
        return facts

    async def models(self) -> list[dict[str, Any]]:
        """Every known model: registry facts, GGUF facts, loaded or not, its load now."""
        entries = await asyncio.to_thread(self.registry.entries)
        loaded = set(self.pool.loaded())
        stats = self.pool.stats()
        tiers = self.tier_defaults()
        out = []
        for e in entries:
            path = str(e.path) if e.path else ""
            facts = await asyncio.to_thread(self._gguf, path) if path else {}
            s = stats.get(e.name)
            out.append(
                {
                    "name": e.name,
                    "available": e.available,
                    "default": e.is_default,
                    "builtin": e.builtin,
                    "source": e.source,
                    "path": path,
                    "description": e.description,
                    "loaded": e.name in loaded,
                    "tiers": sorted(t for t, m in tiers.items() if m == e.name),
                    "gguf": facts,
                    "stats": None
                    if s is None
                    else {
                        "running": s.running,
                        "queue_depth": s.queue_depth,
                        "slots_total": s.slots_total,
                        "kv_cells_used": s.kv_cells_used,
                        "kv_cells_total": s.kv_cells_total,
                    },
                }
            )
        return out

    def tier_defaults(self) -> dict[str, str]:
        """Each tier's default model: the policy's, else the manifest's, else the default."""
        fallback = next((e.name for e in self.registry.entries() if e.is_default), "")
        return {
            name: tier.model or self.registry.tier_model(name) or fallback
            for name, tier in self.policy.tiers.items()
        }

    def _known(self, name: str) -> None:
        if name not in self.registry.names():
            raise LookupError(f"no model named {name!r}")

    async def load(self, actor: User, name: str) -> None:
        self._known(name)
        try:
            await self.pool.get(name)
        except RegistryError as exc:
            raise ModelAdminError(str(exc)) from exc
        await self.audit.record(actor, "model.load", None, model=name)

    async def unload(self, actor: User, name: str) -> None:
        self._known(name)
        if name not in self.pool.loaded():
            raise ModelAdminError(f"{name!r} is not loaded")
        await self.pool.unload(name)
        await self.audit.record(actor, "model.unload", None, model=name)

    async def set_default(self, actor: User, name: str) -> None:
        self._known(name)
        try:
            await asyncio.to_thread(self.registry.set_default, name)
        except RegistryError as exc:
            raise ModelAdminError(str(exc)) from exc
        await self.audit.record(actor, "model.set_default", None, model=name)

    async def add(self, actor: User, path: str, name: str | None, copy: bool) -> str:
        """Register a GGUF already on this server (copied into the models directory when
        `copy`); returns its name. Refuses anything that is not a readable, whole GGUF."""
        if not path.strip().startswith("/"):
            raise ModelAdminError("give the file's absolute path on the server")
        try:
            entry = await asyncio.to_thread(
                self.registry.add, path.strip(), (name or "").strip() or None, False, copy
            )
        except (InvalidModelFile, RegistryError, OSError) as exc:
            raise ModelAdminError(str(exc)) from exc
        await self.audit.record(
            actor, "model.add", None, model=entry.name, path=str(entry.path), copied=copy
        )
        return entry.name
