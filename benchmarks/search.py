"""Search benchmark: how long `GET /v1/search` takes while other members' answers stream.

    python benchmarks/search.py [--gguf PATH] [--streams 2] [--searches 16] [--json OUT]

Starts `chatbox serve` as a user does (tests/served.py; the tiny random model unless `--gguf`
names another) with the shipped policy, so output moderation screens every answer's windows
on the embedding model's background lane, as on a real box. One member has a few chats. It
times a search (words and meaning) four ways:
1. the first search of the box (the embedding model loads, the member's turns are indexed);
2. `--searches` searches with nothing else running;
3. the same while `--streams` other members' answers stream without a pause;
4. each right after one of the member's own answers ends (new turns not yet indexed), while
   the other answers stream.
Target: p99 < 500 ms while answers stream (3 and 4).

The searcher keeps one connection open, as a browser does (a new httpx client per request
costs the client 40-200 ms on a busy machine, which is not the server's). Each phase also
prints the server's own time per search (arrival to response), its query embedding and
reads (from `/metrics`), and the round trip of `GET /healthz` just before each search: what
any request waits for the event loop and a core, before a search does any work.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.served import Served  # noqa: E402
from tests.tinymodel import make_tiny_gguf  # noqa: E402

QUERIES = ("otters sleeping", "bread recipe", "garden shed", "tax forms", "river boat trip")
# A different word each time: a query's vector is cached, and a repeated one would be free.
EXTRA = [
    "red",
    "blue",
    "green",
    "small",
    "large",
    "early",
    "late",
    "quick",
    "slow",
    "warm",
    "cold",
    "old",
    "new",
    "tall",
    "short",
]
TOPICS = (
    "Tell me about sea otters and how they sleep.",
    "Give me a recipe for rye bread.",
    "How do I build a small garden shed?",
    "Which forms do I need for my taxes?",
)


def answer(box: Served, key: str, conv: str, text: str) -> None:
    """Send a message and read its answer's stream to the end."""
    with httpx.stream(
        "POST",
        f"{box.url}/v1/conversations/{conv}/turns",
        headers=box.auth(key),
        json={"content": text},
        timeout=300,
    ) as r:
        r.read()


def query(i: int) -> str:
    first, second = EXTRA[i % len(EXTRA)], EXTRA[(i // len(EXTRA)) % len(EXTRA)]
    return f"{QUERIES[i % len(QUERIES)]} {first} {second}"


PINGS: list[float] = []  # ms of each /healthz round trip, phase by phase


def searched(client: httpx.Client, key: str, q: str) -> float:
    """A /healthz round trip (kept in PINGS), then the search's, in ms."""
    t0 = time.perf_counter()
    client.get("/healthz")
    PINGS.append((time.perf_counter() - t0) * 1000)
    t0 = time.perf_counter()
    r = client.get("/v1/search", params={"q": q}, headers={"Authorization": f"Bearer {key}"})
    took = time.perf_counter() - t0
    assert r.status_code == 200, r.text[:300]
    return took * 1000


def server_times(box: Served) -> dict[str, tuple[float, float]]:
    """(sum of seconds, count) of the server's query embeddings and database reads so far."""
    text = httpx.get(f"{box.url}/metrics", headers=box.admin, timeout=60).text
    out = {}
    for name, family, label in (
        (
            "search (server)",
            "chatbox_http_request_duration_seconds",
            'method="GET",route="/v1/search"',
        ),
        ("embed query", "chatbox_knowledge_embedding_seconds", 'purpose="query"'),
        ("db read (writer's connection)", "chatbox_store_operation_seconds", 'op="read"'),
        ("db read (read connection)", "chatbox_store_operation_seconds", 'op="snapshot"'),
    ):
        found = [
            float(m.group(1))
            for part in ("sum", "count")
            for m in [re.search(rf"^{family}_{part}{{{label}}} (\S+)$", text, re.M)]
            if m
        ]
        out[name] = (found[0], found[1]) if len(found) == 2 else (0.0, 0.0)
    return out


def mean_ms(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> str:
    """Each server-side measure's mean over a phase, in ms."""
    parts = []
    for name, (total, count) in after.items():
        d_total, d_count = total - before[name][0], count - before[name][1]
        if d_count:
            parts.append(f"{name} {1000 * d_total / d_count:.0f} ms x{d_count:.0f}")
    return "; ".join(parts)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def row(name: str, ms: list[float], server: str = "") -> dict[str, Any]:
    pings = PINGS[:]
    PINGS.clear()
    if pings:
        server = (
            f"healthz p50 {statistics.median(pings):.0f} ms, p99 {pct(pings, 99):.0f} ms; " + server
        )
    out = {
        "phase": name,
        "searches": len(ms),
        "p50_ms": statistics.median(ms),
        "p99_ms": pct(ms, 99),
        "max_ms": max(ms),
        "server": server,
    }
    # as it comes: on a loaded machine a run may be stopped before its table
    print(f"{name}: p50 {out['p50_ms']:.0f} ms, p99 {out['p99_ms']:.0f} ms; {server}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gguf", type=Path, help="the model to serve (default: tiny random)")
    parser.add_argument("--streams", type=int, default=2)
    parser.add_argument("--searches", type=int, default=16)
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = args.gguf or make_tiny_gguf(Path(tmp) / "tiny.gguf")
        env = {"CHATBOX_MAX_TOKENS": "64"}
        with (
            Served(Path(tmp), model=model, policy=None, env=env) as box,
            httpx.Client(base_url=box.url, timeout=120) as client,
        ):
            ann = box.user("ann", tier="paid")
            others = [box.user(f"member{i}", tier="paid") for i in range(args.streams)]
            convs = []
            for topic in TOPICS:
                conv = httpx.post(
                    f"{box.url}/v1/conversations", headers=box.auth(ann), json={}, timeout=60
                ).json()["id"]
                answer(box, ann, conv, topic)
                convs.append(conv)
            rows.append(
                row(
                    "first search (model loads, turns indexed)",
                    [searched(client, ann, "first search")],
                )
            )
            mark = server_times(box)
            idle = [searched(client, ann, query(i)) for i in range(args.searches)]
            rows.append(row("idle", idle, mean_ms(mark, mark := server_times(box))))

            stop = threading.Event()

            def stream(key: str) -> None:
                conv = httpx.post(
                    f"{box.url}/v1/conversations", headers=box.auth(key), json={}, timeout=60
                ).json()["id"]
                n = 0
                while not stop.is_set():
                    answer(box, key, conv, f"Write a long story about a dragon, part {n}.")
                    n += 1

            threads = [threading.Thread(target=stream, args=(k,), daemon=True) for k in others]
            for t in threads:
                t.start()
            time.sleep(3.0)  # every stream under way
            mark = server_times(box)
            during = []
            for i in range(args.searches):
                during.append(searched(client, ann, query(100 + i)))
                time.sleep(0.2)
            server = mean_ms(mark, mark := server_times(box))
            rows.append(row(f"while {args.streams} answers stream", during, server))
            after = []
            for i in range(args.searches // 2):
                answer(box, ann, convs[i % len(convs)], f"And one more thing, number {i}?")
                after.append(searched(client, ann, query(200 + i)))
            server = mean_ms(mark, server_times(box))
            rows.append(row(f"right after an answer, {args.streams} streaming", after, server))
            stop.set()
            for t in threads:
                t.join(timeout=120)
    print(f"{'phase':<46} {'n':>3} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for r in rows:
        print(
            f"{r['phase']:<46} {r['searches']:>3} {r['p50_ms']:>8.0f} {r['p99_ms']:>8.0f}"
            f" {r['max_ms']:>8.0f}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
