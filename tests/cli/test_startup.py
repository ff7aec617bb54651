"""The `chatbox` command starts without the web app or llama.cpp where it needs neither."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from chatbox.cli.accounts import ROLES
from chatbox.store.users import ROLES as STORE_ROLES

ROOT = Path(__file__).resolve().parent.parent.parent
HEAVY = ("litestar", "llama_cpp", "torch", "uvicorn", "chatbox.app")

# Runs the command in a fresh interpreter, then prints which modules it loaded.
PROBE = """
import json, sys
from chatbox.cli import main
try:
    main(sys.argv[1:], prog_name="chatbox")
except SystemExit as exc:
    assert not exc.code, exc.code
print(json.dumps(sorted(sys.modules)))
"""


def loaded_by(*args: str, data_dir: Path | None = None) -> set[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHATBOX_")}
    env["CHATBOX_ADMIN_PASSWORD"] = "startup-test-pass"
    if data_dir is not None:
        args = ("--data-dir", str(data_dir), *args)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_help_loads_neither_the_web_app_nor_llama_cpp() -> None:
    modules = loaded_by("--help")
    assert "chatbox.cli" in modules
    assert not [m for m in (*HEAVY, "chatbox.store", "gguf") if m in modules]


def test_users_list_loads_neither_the_web_app_nor_llama_cpp(tmp_path: Path) -> None:
    modules = loaded_by("users", "list", data_dir=tmp_path / "data")
    assert "chatbox.store" in modules
    assert not [m for m in HEAVY if m in modules]


def test_the_cli_offers_the_roles_the_store_accepts() -> None:
    assert ROLES == STORE_ROLES
