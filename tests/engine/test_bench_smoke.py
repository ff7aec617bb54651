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


def test_followup_benchmark_times_every_layout(tmp_path: Path) -> None:
    from tests.tinymodel import make_tiny_gguf

    model = make_tiny_gguf(tmp_path / "tiny.gguf")
    proc = run_benchmark(
        "followup.py", "--model", str(model), "--depth", "100", "--reps", "1", timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {
        line.split("|")[1].strip(): line.strip("|").split("|")[1:]
        for line in proc.stdout.splitlines()
        if line.startswith(("| q8_0", "| f16"))
    }
    assert set(rows) == {"q8_0, flash", "f16, flash", "f16, plain"}
    for cells in rows.values():  # the prefill, then a time for each size and for the split
        assert cells[0].strip().endswith(" s") and float(cells[0].strip()[:-2]) > 0
        times = [float(c) for c in cells[1:]]
        assert len(times) == 5 and all(t > 0 for t in times)
