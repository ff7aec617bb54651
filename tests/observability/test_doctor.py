"""`chatbox doctor` against a served process: where its resident memory goes."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.served import CHATBOX, Served


@pytest.fixture(scope="module")
def box(tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with Served(tmp_path_factory.mktemp("doctor"), model=tiny_gguf) as served:
        yield served


def test_doctor_rows_add_up_to_the_servers_rss_and_name_the_model(box: Served) -> None:
    # an answer first, so that the engine's KV cache and the embedder are in use
    resp = httpx.post(
        box.url + "/v1/chat/completions",
        headers=box.admin,
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=120,
    )
    assert resp.status_code == 200, resp.text
    report = json.loads(box.cli("doctor", "--front", box.url, "--key", box.admin_key, "--json"))
    rss = box.rss_bytes()
    rows = {r["what"]: r["bytes"] for r in report["rows"]}
    assert box.proc is not None and report["pid"] == box.proc.pid
    assert "model weights: tiny" in rows and rows["model weights: tiny"] > 0
    assert "KV cache: tiny" in rows and rows["KV cache: tiny"] > 0
    assert "llama.cpp libraries" in rows and "Python heap and other anonymous memory" in rows
    assert all(v >= 0 for v in rows.values())
    assert sum(rows.values()) == report["total_bytes"]
    assert abs(report["total_bytes"] - rss) <= 0.1 * rss, (report, rss)
    assert report["models"] == ["tiny"]
    assert 1 <= report["malloc_arenas"] <= 2  # capped (CHATBOX_MALLOC_ARENAS), not 8 a core

    text = box.cli("doctor", "--front", box.url, "--key", box.admin_key)
    assert re.search(r"model weights: tiny\s+[\d,.]+ MB", text), text
    assert re.search(r"^\s+total\s+[\d,.]+ MB", text, re.M) and re.search(r"^\s+RSS\s", text, re.M)


def test_memory_is_for_admins_only(box: Served) -> None:
    member = box.user("mia")
    assert httpx.get(box.url + "/v1/admin/memory", headers=box.auth(member)).status_code == 403
    assert httpx.get(box.url + "/v1/admin/memory").status_code == 401
    done = subprocess.run(
        [CHATBOX, "doctor", "--front", box.url, "--key", member],
        env=box.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "403" in done.stderr and not done.stdout


def test_a_restarted_server_moderates_with_its_encoders_and_no_torch_or_sklearn(
    box: Served,
) -> None:
    # the first start exported the embedding graph and checked it against torch; a start
    # after that (every later one) needs neither torch nor sentence-transformers
    box.stop()
    box.start()
    resp = httpx.post(
        box.url + "/v1/chat/completions",
        headers=box.admin,
        json={"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4},
        timeout=120,
    )
    assert resp.status_code == 200, resp.text  # its input was moderated: the encoder ran
    assert box.proc is not None
    maps = Path(f"/proc/{box.proc.pid}/maps").read_text()
    assert "libtorch" not in maps
    # profanity is scored from arrays and the classifier was fitted by a child process:
    # no scikit-learn (and SciPy) here; the cut graph's parts came from the cache: no onnx
    assert "/sklearn/" not in maps and "/scipy/" not in maps
    assert "onnx_cpp2py_export" not in maps
    report = httpx.get(box.url + "/v1/admin/memory", headers=box.admin, timeout=60).json()
    rows = {r["what"]: r["bytes"] for r in report["rows"]}
    assert rows.get("embeddings: exact graph", 0) > 0
    assert rows.get("torch libraries", 0) == 0
