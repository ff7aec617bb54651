"""What shadow traffic costs the users: their time to first token with shadow on and off.

    .venv/bin/python benchmarks/shadow.py [--pairs 4] [--requests 8]

Starts `chatbox serve` as shipped (SmolLM2 answers the free tier, moderation on) in a fresh
data directory, with Gemma 3 270M as the shadow candidate. One user asks, reads the answer
and pauses 1-3 s before the next question, as a person does. Phases alternate, shadow on
(every free answer mirrored: `POST /v1/admin/shadow/start`, percent 100) and off, in pairs
whose order alternates, after an untimed round with shadow on (the candidate loads on its
first shadow); each phase is `--requests` questions. Per pair: the user's median
TTFT on / off. After each "on" phase the server's recent comparisons are read: every user
request that began between a compared shadow's start and end is an overlap (the design says
there are none: a user's request sheds a running shadow, and a shed one is not compared).
Prints the table; the claim: median of the pairs' ratios <= 1.10x, and 0 overlaps.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
CHATBOX = [sys.executable, "-m", "chatbox"]
CANDIDATE = "gemma3-270m"
QUESTIONS = [
    "What is a good way to learn to juggle?",
    "Why is the sky blue?",
    "Give me a tip for writing clearer emails.",
    "How do bees make honey?",
    "What should I pack for a day hike?",
    "How does a bicycle stay upright?",
    "Suggest a name for a pet turtle.",
    "What is the difference between weather and climate?",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli(data: Path, *args: str) -> str:
    done = subprocess.run(
        [*CHATBOX, "--data-dir", str(data), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def serve(data: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [*CHATBOX, "--data-dir", str(data), "serve", "--port", str(port), "--log-level", "warning"],
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit("the server exited while starting")
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("the server did not become ready")


def ask(http: httpx.Client, question: str) -> tuple[float, float, float]:
    """One question in a new chat: (began, ended, ttft), on the wall clock."""
    conv = http.post("/v1/conversations", json={"title": "bench"}).json()["id"]
    began = time.time()
    first: float | None = None
    body = {"content": question, "max_tokens": 48, "fresh": True}  # not the semantic cache
    with http.stream("POST", f"/v1/conversations/{conv}/turns", json=body) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if first is None and line == "event: token":
                first = time.time()
    ended = time.time()
    return began, ended, (first or ended) - began


def phase(http: httpx.Client, n: int, rng: random.Random) -> list[tuple[float, float, float]]:
    out = []
    for _ in range(n):
        out.append(ask(http, rng.choice(QUESTIONS)))
        time.sleep(rng.uniform(1.0, 3.0))  # reading the answer
    return out


def overlaps(asked: list[tuple[float, float, float]], recent: list[dict[str, Any]]) -> int:
    """User requests that began inside a compared shadow (the served answer's own request
    began before its shadow, so it never counts)."""
    return sum(1 for began, _, _ in asked for c in recent if c["started_at"] < began < c["at"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    data = Path(tempfile.mkdtemp(prefix="chatbox-shadow-")) / "data"
    user_key = cli(data, "users", "add", "ann", "--password", "ann-reads-answers", "--key")
    user_key = user_key.strip().splitlines()[-1]
    admin_key = cli(data, "keys", "create", "--user", "admin").strip().splitlines()[-1]
    proc, url = serve(data)
    user = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {user_key}"}, timeout=300)
    admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=60)
    rows = []
    try:
        # One untimed round with shadow on: the first answers of a fresh start, and the
        # candidate's load (its first shadow loads it).
        start = {"candidate": CANDIDATE, "tier": "free", "percent": 100}
        admin.post("/v1/admin/shadow/start", json=start).raise_for_status()
        phase(user, 2, rng)
        time.sleep(10)
        admin.post("/v1/admin/shadow/stop", json={"tier": "free"}).raise_for_status()
        for pair in range(args.pairs):
            result: dict[str, Any] = {}
            for on in (True, False) if pair % 2 == 0 else (False, True):
                if on:
                    admin.post("/v1/admin/shadow/start", json=start).raise_for_status()
                asked = phase(user, args.requests, rng)
                if on:
                    time.sleep(5)  # the last answer's shadow runs in the pause after it
                    status = admin.get("/v1/admin/shadow").json()
                    admin.post("/v1/admin/shadow/stop", json={"tier": "free"}).raise_for_status()
                    since = asked[0][0]
                    recent = [c for c in status["recent"] if c["at"] >= since]
                    result["compared"] = len(recent)
                    result["overlaps"] = overlaps(asked, recent)
                    result["on"] = statistics.median(t for _, _, t in asked)
                else:
                    result["off"] = statistics.median(t for _, _, t in asked)
            result["ratio"] = result["on"] / result["off"]
            rows.append(result)
            print(json.dumps(result), flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    ratios = [r["ratio"] for r in rows]
    print()
    print("| shadow on / off | median of pairs | pairs | target |")
    print("|---|---|---|---|")
    print(
        f"| user TTFT (median per phase) | **{statistics.median(ratios):.2f}x**"
        f" ({statistics.median(r['on'] for r in rows) * 1000:.0f} /"
        f" {statistics.median(r['off'] for r in rows) * 1000:.0f} ms)"
        f" | {', '.join(f'{x:.2f}' for x in ratios)} | <= 1.10x |"
    )
    print(
        f"| user requests begun inside a compared shadow | {sum(r['overlaps'] for r in rows)}"
        f" | {', '.join(str(r['overlaps']) for r in rows)} | 0 |"
    )
    print(
        f"| shadows compared per on-phase of {args.requests} answers | "
        f"{statistics.median(r['compared'] for r in rows):.0f}"
        f" | {', '.join(str(r['compared']) for r in rows)} | (reference) |"
    )


if __name__ == "__main__":
    main()
