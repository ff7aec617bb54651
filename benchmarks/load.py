"""Load test of the gateway: N users on two tiers at a set arrival rate against a server.

    python benchmarks/load.py --spawn [--users 12] [--paid-share 0.25] [--overload 3]
    python benchmarks/load.py --url http://HOST:8000 --key free=KEY --key paid=KEY \
        [--key free=KEY2 ...] --rate 6 [--pid SERVER_PID]

With --spawn it starts its own server (SmolLM2, a benchmark policy without per-user rate
limits so only overload decides, free tier shed above the high-water mark) with users made
in its data directory, then runs four phases:

1. calibrate: `slots` paid streams back to back -> the box's capacity C (requests/s);
2. idle: one paid request at a time (for reference);
3. unloaded: the paid users' share of the overload traffic, alone -> the paid baseline;
4. overload: every user at `overload` x C (Poisson arrivals) -> per tier admitted / shed
   (503) / limited (429) / degraded counts and TTFT p50/p99, compared with phase 3.

The server's resident memory is sampled throughout. The claim checked: under 3x overload
the paid tier's TTFT p99 stays within 2x of its unloaded value, free requests are shed
with 503s, and memory stays flat. Results go to benchmarks/results/load.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TOPICS = [
    "rivers",
    "bread",
    "owls",
    "chess",
    "tea",
    "kites",
    "bees",
    "maps",
    "comets",
    "coral",
    "violins",
    "glaciers",
]
BENCH_POLICY = """
[tiers.free]
rpm = 0
tpm = 0
max_streams = 64
model = "{model}"
overload = "shed"
priority = 2

[tiers.paid]
rpm = 0
tpm = 0
max_streams = 64
model = "{model}"
overload = "queue"
priority = 0

[overload]
high_water = {high_water}
retry_after_s = 2
"""


@dataclass
class Result:
    tier: str
    status: int
    ttft: float | None = None  # seconds to the first content token
    total: float = 0.0
    model: str | None = None
    degraded: bool = False
    error: str | None = None


@dataclass
class Memory:
    pid: int | None
    samples: list[tuple[float, int]] = field(default_factory=list)

    def rss(self) -> int | None:
        if self.pid is None:
            return None
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    async def watch(self, stop: asyncio.Event, every_s: float = 0.5) -> None:
        while not stop.is_set():
            value = self.rss()
            if value is not None:
                self.samples.append((time.monotonic(), value))
            await asyncio.sleep(every_s)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def one(
    http: httpx.AsyncClient, url: str, key: str, tier: str, max_tokens: int, rng: random.Random
) -> Result:
    """One streamed chat completion; TTFT is the time to its first content token."""
    topic = rng.choice(TOPICS)
    body = {
        "messages": [{"role": "user", "content": f"Write two sentences about {topic}."}],
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0.7,
    }
    start = time.monotonic()
    result = Result(tier, 0)
    try:
        async with http.stream(
            "POST",
            f"{url}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
        ) as response:
            result.status = response.status_code
            result.model = response.headers.get("x-chatbox-model")
            result.degraded = "x-chatbox-degraded-from" in response.headers
            if response.status_code != 200:
                await response.aread()
                result.error = response.text[:200]
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                choices = chunk.get("choices") or [{}]
                if result.ttft is None and choices[0].get("delta", {}).get("content"):
                    result.ttft = time.monotonic() - start
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    result.total = time.monotonic() - start
    return result


async def open_loop(
    url: str, users: list[tuple[str, str]], rate: float, duration: float, max_tokens: int, seed: int
) -> list[Result]:
    """Poisson arrivals at `rate`/s for `duration` s, each from a random user."""
    rng = random.Random(seed)
    tasks: list[asyncio.Task[Result]] = []
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0), limits=limits) as http:
        end = time.monotonic() + duration
        while time.monotonic() < end:
            tier, key = rng.choice(users)
            tasks.append(asyncio.create_task(one(http, url, key, tier, max_tokens, rng)))
            await asyncio.sleep(rng.expovariate(rate))
        return list(await asyncio.gather(*tasks))


async def closed_loop(
    url: str, key: str, concurrency: int, total: int, max_tokens: int
) -> tuple[float, list[Result]]:
    """`concurrency` back-to-back streams: requests/s and the results."""
    rng = random.Random(0)
    left = total
    results: list[Result] = []

    async def worker(http: httpx.AsyncClient) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            results.append(await one(http, url, key, "paid", max_tokens, rng))

    async with httpx.AsyncClient(timeout=300.0) as http:
        await one(http, url, key, "paid", max_tokens, rng)  # warm up
        start = time.monotonic()
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
        return total / (time.monotonic() - start), results


def summarise(results: list[Result]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for tier in sorted({r.tier for r in results}):
        rs = [r for r in results if r.tier == tier]
        ttfts = [r.ttft for r in rs if r.status == 200 and r.ttft is not None]
        out[tier] = {
            "sent": len(rs),
            "admitted": sum(r.status == 200 for r in rs),
            "shed_503": sum(r.status == 503 for r in rs),
            "limited_429": sum(r.status == 429 for r in rs),
            "degraded": sum(r.degraded for r in rs),
            "errors": sum(r.status not in (200, 429, 503) for r in rs),
            "ttft_p50_ms": _ms(pct(ttfts, 50)),
            "ttft_p99_ms": _ms(pct(ttfts, 99)),
            "ttft_mean_ms": _ms(statistics.fmean(ttfts)) if ttfts else None,
        }
    return out


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)


def print_table(title: str, summary: dict[str, dict[str, Any]]) -> None:
    print(f"\n{title}")
    cols = [
        "sent",
        "admitted",
        "shed_503",
        "limited_429",
        "degraded",
        "errors",
        "ttft_p50_ms",
        "ttft_p99_ms",
    ]
    print("  tier   " + "".join(c.rjust(13) for c in cols))
    for tier, row in summary.items():
        print(f"  {tier:<7}" + "".join(str(row[c]).rjust(13) for c in cols))


# -- a server of our own -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def make_users(data_dir: Path, n: int, paid_share: float) -> list[tuple[str, str]]:
    """n users (the first round(n * paid_share) paid), each with an API key."""
    from chatbox.accounts import ensure_admin
    from chatbox.settings import Settings
    from chatbox.store import Store

    settings = Settings(data_dir=data_dir, admin_password="load-test-admin")
    n_paid = max(1, round(n * paid_share))

    async def run() -> list[tuple[str, str]]:
        settings.ensure_dirs()
        store = await Store.open(settings.db_path)
        try:
            await ensure_admin(store, settings)
            users = []
            for i in range(n):
                tier = "paid" if i < n_paid else "free"
                user = await store.users.create(f"{tier}{i}", tier=tier)
                users.append((tier, (await store.keys.create(user.id, "load"))[1]))
            return users
        finally:
            await store.close()

    return asyncio.run(run())


def spawn(args: argparse.Namespace, data_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    policy = data_dir / "policy.toml"
    policy.write_text(BENCH_POLICY.format(model=args.model, high_water=args.high_water))
    port = free_port()
    env = {**os.environ, "CHATBOX_ADMIN_PASSWORD": "load-test-admin"}
    cmd = [
        sys.executable,
        "-m",
        "chatbox",
        "--data-dir",
        str(data_dir),
        "serve",
        "--port",
        str(port),
        "--model",
        args.model,
        "--n-parallel",
        str(args.slots),
        "--n-ctx",
        str(args.slots * 1024),
        "--n-ctx-per-seq",
        "1024",
        "--policy",
        str(policy),
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit("the server exited while starting")
        time.sleep(0.3)
    proc.kill()
    raise SystemExit("the server did not become ready")


async def run_phases(
    args: argparse.Namespace, url: str, users: list[tuple[str, str]], pid: int | None
) -> dict[str, Any]:
    memory = Memory(pid)
    stop = asyncio.Event()
    watcher = asyncio.create_task(memory.watch(stop))
    paid = [u for u in users if u[0] == "paid"]
    results: dict[str, Any] = {
        "url": url,
        "users": {t: sum(u[0] == t for u in users) for t in ("free", "paid")},
    }
    try:
        capacity = (
            args.capacity
            or (await closed_loop(url, paid[0][1], args.slots, args.slots * 3, args.max_tokens))[0]
        )
        results["capacity_rps"] = round(capacity, 2)
        print(
            f"capacity: {capacity:.2f} requests/s ({args.slots} slots, "
            f"{args.max_tokens} tokens each)"
        )
        _, idle = await closed_loop(url, paid[0][1], 1, args.unloaded, args.max_tokens)
        results["idle"] = summarise(idle)
        print_table("idle: one paid request at a time", results["idle"])
        rate = args.rate or args.overload * capacity
        paid_rate = rate * len(paid) / len(users)
        unloaded = await open_loop(url, paid, paid_rate, args.duration, args.max_tokens, 1)
        results["unloaded"] = summarise(unloaded)
        print_table(
            f"unloaded: the paid users' own traffic alone ({paid_rate:.2f}/s)", results["unloaded"]
        )
        rss_before = memory.rss()
        loaded = await open_loop(url, users, rate, args.duration, args.max_tokens, 2)
        rss_after = memory.rss()
        results["overload"] = summarise(loaded)
        results["overload_rate_rps"] = round(rate, 2)
        print_table(
            f"overload: all users at {rate:.2f}/s ({rate / capacity:.1f}x capacity)",
            results["overload"],
        )
    finally:
        stop.set()
        await watcher
    rss = [v for _, v in memory.samples]
    if rss:
        results["rss_mib"] = {
            "start": _mib(rss[0]),
            "before_overload": _mib(rss_before),
            "after_overload": _mib(rss_after),
            "max": _mib(max(rss)),
        }
        print(f"\nserver RSS (MiB): {results['rss_mib']}")
    verdict(results)
    return results


def _mib(value: int | None) -> float | None:
    return None if value is None else round(value / 2**20, 1)


def verdict(results: dict[str, Any]) -> None:
    base = results["unloaded"].get("paid", {}).get("ttft_p99_ms")
    paid = results["overload"].get("paid", {})
    free = results["overload"].get("free", {})
    checks = {}
    if base and paid.get("ttft_p99_ms"):
        checks["paid_p99_within_2x"] = paid["ttft_p99_ms"] <= 2 * base
        print(
            f"paid TTFT p99: {paid['ttft_p99_ms']} ms loaded vs {base} ms unloaded "
            f"({paid['ttft_p99_ms'] / base:.2f}x)"
        )
    checks["free_shed_with_503"] = free.get("shed_503", 0) > 0
    checks["no_errors"] = all(r.get("errors", 0) == 0 for r in results["overload"].values())
    rss = results.get("rss_mib")
    if rss and rss.get("before_overload") and rss.get("after_overload"):
        growth = rss["after_overload"] - rss["before_overload"]
        checks["memory_flat"] = growth <= max(64.0, 0.1 * rss["before_overload"])
    results["checks"] = checks
    print("checks: " + ", ".join(f"{k}={'PASS' if v else 'FAIL'}" for k, v in checks.items()))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--spawn", action="store_true", help="start a server of our own")
    ap.add_argument("--url", help="a running server")
    ap.add_argument("--key", action="append", default=[], help="TIER=API_KEY (repeatable)")
    ap.add_argument("--pid", type=int, help="the server's pid, to sample its memory")
    ap.add_argument("--users", type=int, default=16)
    ap.add_argument("--paid-share", type=float, default=0.125, help="of the users")
    ap.add_argument("--overload", type=float, default=3.0, help="x capacity")
    ap.add_argument("--rate", type=float, help="arrivals/s (default: overload x capacity)")
    ap.add_argument("--capacity", type=float, help="skip calibration: requests/s")
    ap.add_argument("--duration", type=float, default=40.0, help="seconds of overload")
    ap.add_argument("--unloaded", type=int, default=20, help="requests for the baseline")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--slots", type=int, default=8)
    # On a CPU every extra sequence in the batch slows each step for everyone, so free
    # requests only get in while the engine holds fewer than this many requests.
    ap.add_argument(
        "--high-water",
        type=int,
        default=2,
        help="spawned server's mark (requests in the engine at which free is shed)",
    )
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "load.json"))
    args = ap.parse_args()
    proc = None
    if args.spawn:
        data_dir = Path(tempfile.mkdtemp(prefix="chatbox-load-"))
        users = make_users(data_dir, args.users, args.paid_share)
        proc, url = spawn(args, data_dir)
        pid: int | None = proc.pid
    elif args.url and args.key:
        url, pid = args.url.rstrip("/"), args.pid
        users = [tuple(k.split("=", 1)) for k in args.key]  # type: ignore[misc]
        if not any(t == "paid" for t, _ in users):
            raise SystemExit("give at least one --key paid=KEY")
    else:
        raise SystemExit("use --spawn, or --url with --key TIER=KEY ...")
    try:
        results = asyncio.run(run_phases(args, url, users, pid))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    results["args"] = {k: v for k, v in vars(args).items() if k != "key"}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
