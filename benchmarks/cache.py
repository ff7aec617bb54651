"""The exact-match answer cache: what a hit costs, and what it gains on a replayed workload.

    python benchmarks/cache.py [--hits 200] [--requests 40] [--repeat 0.3] [--concurrency 4]
                               [--pairs 3]

Starts two `chatbox serve` processes as a user does (tests/served.py: the console script,
the shipped models; SmolLM2 by default, `--gguf PATH` serves another file, `--tiny` the
tests' tiny random model), one with the answer cache on and one with it off, each with
moderation off and no rate limits; both run throughout, so a machine's changing load
falls on both alike.

1. Exact hit: one deterministic request (temperature 0), then `--hits` identical ones, one
   after another; client-side latency over loopback (HTTP, auth, admission, the charge, the
   lookup). Target: p99 < 5 ms.
2. Replay: `--requests` deterministic requests, `--repeat` of them a repeat of an earlier
   one (a fixed random order), `--concurrency` at once; requests/s with the cache on
   against off, same order on both servers. `--pairs` interleaved pairs (on then off, then
   off then on, ...), each pair a workload of its own (no prompt of one pair repeats in
   another); the gain is the median of the pairs' ratios.
Results go to benchmarks/results/cache.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.served import Served  # noqa: E402

POLICY = """
[tiers.free]
rpm = 0
tpm = 0
max_streams = 64
model = "{model}"
overload = "queue"

[answer_cache]
enabled = {enabled}

[moderation]
enabled = false
"""
ACCESS = r"POST /v1/chat/completions 200 ([0-9.]+) ms"
TOPICS = [
    "the tides",
    "bread yeast",
    "a bicycle's gears",
    "rainbows",
    "compound interest",
    "volcanoes",
    "the moon's phases",
    "honeybees",
    "lighthouses",
    "paper folding",
    "glaciers",
    "sourdough",
    "tea leaves",
    "thunder",
    "ocean salt",
    "maple syrup",
    "the compass",
    "coral reefs",
    "pendulum clocks",
    "sand dunes",
]


def note(what: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


def start(where: Path, enabled: bool, gguf: Path | None) -> tuple[Served, str]:
    model = "tiny" if gguf else "smollm2"
    policy = where / "policy.toml"
    where.mkdir(parents=True, exist_ok=True)
    policy.write_text(POLICY.format(model=model, enabled=str(enabled).lower()))
    # The user's cache directory: the CPU serving copy and the kernel timing are made once.
    cache = {"CHATBOX_CACHE_DIR": str(Path.home() / ".cache" / "chatbox")}
    box = Served(where, model=gguf, policy=policy, env=cache).start(timeout_s=600)
    return box, box.user("bench")


def body(prompt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": "tiny" if ARGS.gguf else "smollm2",
        "temperature": 0,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": prompt}],
    }


def exact_hits(box: Served, key: str, count: int) -> dict[str, Any]:
    request = body("Explain in two sentences why the sky is blue.", ARGS.max_tokens)
    with httpx.Client(base_url=box.url, headers=box.auth(key), timeout=120) as http:
        first = http.post("/v1/chat/completions", json=request)
        assert first.headers.get("x-chatbox-cache") == "miss", first.headers
        time.sleep(1.0)  # the first answer's log line is written
        mark = len(box.log())
        times = []
        for _ in range(count):
            t0 = time.perf_counter()
            r = http.post("/v1/chat/completions", json=request)
            times.append((time.perf_counter() - t0) * 1000)
            assert r.headers.get("x-chatbox-cache") == "hit" and r.content == first.content
    # The server's own time for each (its access log line): without the client's share of
    # the cores, which on a loaded machine dominates the tail.
    served = sorted(float(ms) for ms in re.findall(ACCESS, box.log()[mark:]))
    times.sort()
    return {
        "p50_ms": statistics.median(times),
        "p99_ms": pick(times, 0.99),
        "max_ms": times[-1],
        "server_p50_ms": statistics.median(served),
        "server_p99_ms": pick(served, 0.99),
    }


def pick(values: list[float], q: float) -> float:
    return values[int(q * (len(values) - 1))]


def workload(n: int, repeat: float, pair: int = 0) -> list[str]:
    """n prompts in a fixed order; about `repeat` of them repeat an earlier one."""
    rng = random.Random(7 + pair)
    out: list[str] = []
    fresh = 0
    for _ in range(n):
        if out and rng.random() < repeat:
            out.append(rng.choice(out))
        else:
            topic = TOPICS[fresh % len(TOPICS)]
            out.append(f"In three sentences, what is interesting about {topic}? ({pair}.{fresh})")
            fresh += 1
    return out


async def replay(box: Served, key: str, prompts: list[str]) -> dict[str, Any]:
    queue: asyncio.Queue[str] = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    hits = 0
    tokens = 0

    async def worker(http: httpx.AsyncClient) -> None:
        nonlocal hits, tokens
        while not queue.empty():
            prompt = queue.get_nowait()
            r = await http.post("/v1/chat/completions", json=body(prompt, ARGS.max_tokens))
            r.raise_for_status()
            hits += r.headers.get("x-chatbox-cache") == "hit"
            tokens += r.json()["usage"]["completion_tokens"]

    async with httpx.AsyncClient(base_url=box.url, headers=box.auth(key), timeout=300) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(http) for _ in range(ARGS.concurrency)))
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, "rps": len(prompts) / seconds, "hits": hits, "tokens": tokens}


def warm(box: Served, key: str) -> None:
    """One untimed request first: the model's load and first prefill."""
    httpx.post(
        box.url + "/v1/chat/completions",
        json=body("Say hello.", 4),
        headers=box.auth(key),
        timeout=300,
    )


def main() -> None:
    results: dict[str, Any] = {"pairs": [], "args": {k: str(v) for k, v in vars(ARGS).items()}}
    with tempfile.TemporaryDirectory(prefix="chatbox-bench-cache-") as tmp:
        note("starting two servers, the cache on and off")
        boxes: dict[str, tuple[Served, str]] = {}
        try:
            for name in ("on", "off"):
                boxes[name] = start(Path(tmp) / name, name == "on", ARGS.gguf)
            note("ready")
            for box, key in boxes.values():
                warm(box, key)
            results["hit"] = exact_hits(*boxes["on"], ARGS.hits)
            note(f"exact hits: {results['hit']}")
            for pair in range(ARGS.pairs):
                prompts = workload(ARGS.requests, ARGS.repeat, pair)
                order = ("on", "off") if pair % 2 == 0 else ("off", "on")
                runs = {name: asyncio.run(replay(*boxes[name], prompts)) for name in order}
                runs["repeats"] = len(prompts) - len(set(prompts))
                runs["gain"] = runs["on"]["rps"] / runs["off"]["rps"]
                results["pairs"].append(runs)
                note(f"pair {pair + 1}: {runs}")
        finally:
            for box, _ in boxes.values():
                box.stop()
    pairs, hit = results["pairs"], results["hit"]
    results["gain"] = statistics.median(p["gain"] for p in pairs)
    on_rps = statistics.median(p["on"]["rps"] for p in pairs)
    off_rps = statistics.median(p["off"]["rps"] for p in pairs)
    hits = statistics.median(p["on"]["hits"] for p in pairs)
    repeats = statistics.median(p["repeats"] for p in pairs)
    print("| measure | result | target |")
    print("|---|---|---|")
    print(
        f"| exact hit, {ARGS.hits} in a row, at the client | p50 {hit['p50_ms']:.2f} ms, "
        f"p99 {hit['p99_ms']:.2f} ms (max {hit['max_ms']:.1f}) | p99 < 5 ms |"
    )
    print(
        f"| exact hit, in the server (access log) | p50 {hit['server_p50_ms']:.2f} ms, "
        f"**p99 {hit['server_p99_ms']:.2f} ms** | p99 < 5 ms |"
    )
    print(
        f"| replay: {ARGS.requests} requests ({repeats:.0f} repeats), {ARGS.concurrency} at "
        f"once, median of {len(pairs)} interleaved pairs | cache on {on_rps:.2f} req/s "
        f"({hits:.0f} hits), off {off_rps:.2f} req/s: **{results['gain']:.2f}x** | > 1x |"
    )
    print("| each pair's gain | " + ", ".join(f"{p['gain']:.2f}x" for p in pairs) + " | |")
    out = ROOT / "benchmarks" / "results" / "cache.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hits", type=int, default=200)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--repeat", type=float, default=0.3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=3, help="interleaved on/off pairs")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--gguf", type=Path, default=None)
    parser.add_argument("--tiny", action="store_true", help="serve the tests' tiny random model")
    ARGS = parser.parse_args()
    if ARGS.tiny and ARGS.gguf is None:
        from tests.tinymodel import make_tiny_gguf

        ARGS.gguf = make_tiny_gguf(Path(tempfile.mkdtemp(prefix="chatbox-tiny-")) / "tiny.gguf")
    main()
