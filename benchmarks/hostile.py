"""Hostile schemas benchmark: what one member's oversized JSON schema costs everyone else.

    python benchmarks/hostile.py [--gguf PATH] [--repeat 3] [--json OUT]

Starts `chatbox serve` as a user does (tests/served.py; the tiny random model unless
`--gguf` names another) and sends, one at a time, each schema of
tests/integration/test_hostile_schemas.py (response_format or a required tool call) plus a
`maxLength: 1e9` one that is served. For each: the status and time to answer, the server's
RSS before and after, and another member's 8-token answer latency while it is in flight,
against the same answer's latency with nothing else running (median of `--repeat`).
Targets: a 400 in < 1 s, RSS < +100 MB, the other member delayed < 1 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.integration.test_hostile_schemas import HOSTILE, ask, fmt, one  # noqa: E402
from tests.served import Served  # noqa: E402
from tests.tinymodel import make_tiny_gguf  # noqa: E402

MB = 2**20


def timed(box: Served, key: str, extra: dict[str, Any] | str) -> tuple[int, float]:
    t0 = time.perf_counter()
    reply = ask(box, key, extra)
    return reply.status_code, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gguf", type=Path, help="the model to serve (default: tiny random)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    cases: dict[str, Any] = {name: make for name, (make, _, _) in HOSTILE.items()}
    cases["maxLength 1e9 (served)"] = lambda: fmt(
        one({"type": "string", "maxLength": 1_000_000_000})
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = args.gguf or make_tiny_gguf(Path(tmp) / "tiny.gguf")
        with Served(Path(tmp), model=model) as box:
            # paid: the other member's answers stay within its requests-per-minute
            mallory, ann = box.user("mallory"), box.user("ann", tier="paid")
            timed(box, ann, {})  # first-answer allocations (models loaded on first use)
            idle = statistics.median(timed(box, ann, {})[1] for _ in range(args.repeat))
            with ThreadPoolExecutor(max_workers=2) as pool:
                for name, make in cases.items():
                    body = make()  # encoded here: the client's json.dumps is not the server's time
                    body = body if isinstance(body, str) else json.dumps(body)[1:-1]
                    rss0 = box.rss_bytes()
                    others = []
                    status, took = 0, 0.0
                    for _ in range(args.repeat):
                        hostile = pool.submit(timed, box, mallory, body)
                        code, latency = timed(box, ann, {})
                        assert code == 200, f"the other member's answer: {code}"
                        others.append(latency)
                        status, took = hostile.result()
                    rows.append(
                        {
                            "schema": name,
                            "status": status,
                            "answer_s": took,
                            "rss_before_mb": rss0 / MB,
                            "rss_after_mb": box.rss_bytes() / MB,
                            "other_idle_s": idle,
                            "other_during_s": statistics.median(others),
                        }
                    )
                    print_row(rows[-1], first=len(rows) == 1)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


def print_row(r: dict[str, Any], first: bool) -> None:
    if first:
        print(
            f"| {'schema':28} | status | answer s | RSS before MB | RSS after MB |"
            " other idle s | other during s |"
        )
        print(
            f"|{'-' * 30}|--------|----------|---------------|--------------|"
            "--------------|----------------|"
        )
    print(
        f"| {r['schema']:28} | {r['status']:6} | {r['answer_s']:8.3f} |"
        f" {r['rss_before_mb']:13.1f} | {r['rss_after_mb']:12.1f} |"
        f" {r['other_idle_s']:12.3f} | {r['other_during_s']:14.3f} |",
        flush=True,
    )


if __name__ == "__main__":
    main()
