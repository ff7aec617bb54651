"""Resident memory of `chatbox serve` as shipped: at ready, after a load, with Gemma answering.

    python benchmarks/memory.py [--slots 8] [--max-tokens 32] [--deep-tokens 600] [--json OUT]

Starts chatbox as a team runs it (default moderation in and out, shipped engine settings;
peer.py's policy, so one user may run every slot) and prints its RSS (VmRSS) and its own
breakdown of it (`chatbox doctor`'s rows, with their sum) at three points:

1. at ready: `/readyz` answered and RSS settled (encoders and classifiers load after it);
2. after the load, on SmolLM2 through the `openai` client: 8 concurrent answers, a
   ~1,800-token history with its follow-up, and 8 concurrent follow-ups on ~600-token
   conversations (peer.py's "concurrent", "history" and "deep" parts, shorter answers);
3. with Gemma 3 270M (the paid tier's model) also answering: one short question and one
   ~1,800-token history.

Targets: after the load <= 900 MB; with Gemma answering <= 1,300 MB; the breakdown's rows
within 10% of RSS. Results go to benchmarks/results/memory.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.peer import (  # noqa: E402
    Server,
    history,
    openai_client,
    rss_mb,
    run_phase,
    settle_memory,
    start_chatbox,
    stream,
)

GEMMA = "gemma3-270m"
POINTS = ("at ready", "after the load", "Gemma answered")
TARGETS = {"after the load": 900.0, "Gemma answered": 1300.0}


def report_of(server: Server) -> dict[str, Any]:
    """chatbox's memory report (GET /v1/admin/memory)."""
    resp = httpx.get(
        server.url + "/v1/admin/memory",
        headers={"Authorization": f"Bearer {server.admin}"},
        timeout=60,
    )
    resp.raise_for_status()
    data: dict[str, Any] = resp.json()
    return data


async def ask_gemma(server: Server, args: argparse.Namespace) -> None:
    """One short question and one long history, answered by the paid tier's model."""
    client = openai_client(server)
    nonce = uuid.uuid4().hex[:8]
    try:
        ask = [{"role": "user", "content": f"[{nonce}] Write a short poem about tea."}]
        await stream(client, GEMMA, ask, args.max_tokens)
        await stream(client, GEMMA, history(nonce, args.history_tokens), args.max_tokens)
    finally:
        await client.close()


def measure(server: Server, point: str) -> dict[str, Any]:
    """RSS and the breakdown, read together once RSS has settled."""
    settle_memory([server], 20.0)
    report = report_of(server)
    rss = rss_mb(server)
    print(f"{point}: RSS {rss:,.0f} MB", flush=True)
    return {"rss_mb": rss, "report": report}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--slots", type=int, default=8, help="concurrent streams of the load")
    ap.add_argument("--max-tokens", type=int, default=32, help="tokens per answer")
    ap.add_argument("--history-tokens", type=int, default=1800)
    ap.add_argument("--deep-tokens", type=int, default=600)
    ap.add_argument("--chatbox-arg", action="append", default=[], help="extra `serve` flag")
    ap.add_argument("--no-gemma", action="store_true", help="skip the third point")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "memory.json"))
    args = ap.parse_args(argv)
    # what peer.py's helpers read
    args.as_shipped, args.moderation, args.threads = True, True, 0
    args.ttft_reps, args.pause, args.n_ctx = 1, 0.5, 0
    work = Path(tempfile.mkdtemp(prefix="chatbox-memory-"))
    t0 = time.monotonic()
    server = start_chatbox(args, work)
    points: dict[str, dict[str, Any]] = {}
    try:
        points["at ready"] = measure(server, "at ready")
        for phase in ("concurrent", "history", "deep"):
            asyncio.run(run_phase(server, args, phase))
        points["after the load"] = measure(server, "after the load")
        if not args.no_gemma:
            asyncio.run(ask_gemma(server, args))
            points["Gemma answered"] = measure(server, "Gemma answered")
    finally:
        server.stop()
    print(f"\n{time.monotonic() - t0:.0f} s; server log in {work}")
    print_tables(points)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "points": points}, indent=2))
    print(f"wrote {out}")
    return 0


def print_tables(points: dict[str, dict[str, Any]]) -> None:
    names = [p for p in POINTS if p in points]
    print("\n| | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    print("| RSS MB | " + " | ".join(f"{points[p]['rss_mb']:,.0f}" for p in names) + " |")
    sums = [sum(r["bytes"] for r in points[p]["report"]["rows"]) / 2**20 for p in names]
    print("| breakdown's rows MB | " + " | ".join(f"{s:,.0f}" for s in sums) + " |")
    off = [s / points[p]["rss_mb"] - 1 for s, p in zip(sums, names, strict=True)]
    print("| rows / RSS - 1 | " + " | ".join(f"{o:+.1%}" for o in off) + " |")
    print("| target MB | " + " | ".join(f"{TARGETS.get(p, 0):,.0f}" or "" for p in names) + " |")
    rows: dict[str, dict[str, float]] = {}
    for p in names:
        for r in points[p]["report"]["rows"]:
            rows.setdefault(r["what"], {})[p] = r["bytes"] / 2**20
    last = names[-1]
    print("\n| where RSS goes, MB | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for what in sorted(rows, key=lambda w: -rows[w].get(last, 0.0)):
        cells = " | ".join(f"{rows[what].get(p, 0.0):,.1f}" for p in names)
        print(f"| {what} | {cells} |")


if __name__ == "__main__":
    raise SystemExit(main())
