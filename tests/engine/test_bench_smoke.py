"""The engine benchmark runs end to end (tiny model, quick sizes; no speed asserts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(script: str, *args: str, timeout: int) -> subprocess.CompletedProcess[str]:
    """benchmarks/<script> run as a user would, from the repository root."""
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def test_benchmark_quick_smoke(tmp_path: Path) -> None:
    out = tmp_path / "engine.json"
    proc = run_benchmark("engine.py", "--quick", "--model", "tiny", "--json", str(out), timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "streams" in proc.stdout and "second turn" in proc.stdout
    data = json.loads(out.read_text())
    assert [row["streams"] for row in data["throughput"]] == [1, 4, 8]
    assert data["second_turn"]["warm_ttft"] > 0
    assert data["long_prompt_stall"]["tpot_without"] > 0


def test_followup_benchmark_times_both_kernels(tmp_path: Path) -> None:
    from tests.tinymodel import make_tiny_gguf

    model = make_tiny_gguf(tmp_path / "tiny.gguf")
    proc = run_benchmark(
        "followup.py", "--model", str(model), "--depth", "100", "--reps", "1", timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| flash") or
            line.startswith("| plain")]  # fmt: skip
    assert len(rows) == 2
    for row in rows:  # a time for each size and for the split, all positive
        cells = [float(c) for c in row.strip("|").split("|")[1:]]
        assert len(cells) == 5 and all(c > 0 for c in cells)
