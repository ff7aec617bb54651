"""`chatbox serve` refuses to start without a model, and says how to add one."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from chatbox.cli import main


def test_serve_without_any_model_explains_how_to_add_one(tmp_path: Path) -> None:
    manifest = tmp_path / "empty.toml"
    manifest.write_text("# no built-in models\n")
    result = CliRunner().invoke(
        main,
        ["--data-dir", str(tmp_path / "data"), "serve"],
        env={"CHATBOX_MANIFEST_PATH": str(manifest)},
    )
    assert result.exit_code != 0
    assert "chatbox models add" in result.output
    assert (tmp_path / "data").is_dir()  # the data directory is created on first run


def test_serve_with_an_unknown_model_lists_the_known_ones(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["--data-dir", str(tmp_path), "serve", "--model", "nope"])
    assert result.exit_code != 0
    assert "nope" in result.output and "smollm2" in result.output


def test_serve_help_lists_engine_flags() -> None:
    result = CliRunner().invoke(main, ["serve", "--help"])
    assert result.exit_code == 0
    for flag in (
        "--n-parallel",
        "--n-ctx",
        "--n-batch",
        "--threads",
        "--gpu-layers",
        "--flash-attn",
        "--kv-type",
    ):
        assert flag in result.output


def test_serve_refuses_a_read_replica_without_the_primary(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        ["--data-dir", str(tmp_path), "serve", "--database-replica-url", "postgresql://r/db"],
        env={"CHATBOX_DATABASE_URL": None},
    )
    assert result.exit_code == 1, result.output
    assert "database_replica_url needs database_url" in result.output
    assert "Traceback" not in result.output
