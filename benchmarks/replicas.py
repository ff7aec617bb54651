"""Router-mode benchmark: one front before one vs two `chatbox replica` processes.

    python benchmarks/replicas.py [--model smollm2|tiny] [--runs 3] [--tokens 128] [--json OUT]

Each replica runs one decode thread pinned to its own core (`taskset -c N`); the front is
unpinned (it shares the cores, so its per-token cost limits the ratio: it is measured and
reported as front CPU seconds per streamed token). For 8 and 16 concurrent streams through
the front's OpenAI-compatible API it reports aggregate tokens/s with 1 and with 2 replicas,
the median of `--runs` interleaved runs; then the stream gap during a failover (kill -9 of
the serving replica: the longest pause between two tokens the client saw). The affinity
hit rate is measured by tests/cluster/test_router.py (20 conversations x 3 turns).
Target (2-core machine, SmolLM2-135M): 2 replicas >= 1.5x one replica at 8 and 16 streams.

Two replicas split N streams into two batches of N/2, and a batch of N/2 decodes fewer
tokens a second than a batch of N on one core. So the run also measures one replica at N/2
streams (interleaved with the rest): twice that is what two replicas could reach with a
front that cost nothing, and the table gives that ceiling's ratio and how much of it the
front reaches.
Run it on a quiet machine: other load on the cores skews every number here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
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
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.load import BENCH_POLICY  # noqa: E402
from chatbox.catalog.registry import ModelRegistry  # noqa: E402
from tests.conftest import LiveServer, default_model_path, test_settings  # noqa: E402
from tests.tinymodel import make_tiny_gguf  # noqa: E402

TOKEN = "bench-replica-token"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_replica(data: Path, model: str, core: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    args = ["taskset", "-c", str(core), sys.executable, "-m", "chatbox", "--data-dir", str(data)]
    args += ["replica", "--port", str(port), "--model", model, "--token", TOKEN]
    args += ["--threads", "1", "--n-parallel", "16", "--n-ctx", "16384", "--n-ctx-per-seq", "2048"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHATBOX_")}
    proc = subprocess.Popen(args, cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(proc, url, TOKEN)
    return proc, url


def wait_healthy(
    proc: subprocess.Popen[bytes], url: str, token: str, timeout_s: float = 120
) -> None:
    """Until the replica at url answers its health check; RuntimeError if it exits first
    or takes longer than timeout_s (it is killed then)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            auth = {"Authorization": f"Bearer {token}"}
            if httpx.get(url + "/v1/replica/health", headers=auth).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the replica at {url} did not start")


async def one_stream(client: httpx.AsyncClient, model: str, i: int, tokens: int) -> int:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Write about topic number {i}."}],
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    got = 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        async for line in resp.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    got = int(chunk["usage"]["completion_tokens"])
    return got


async def throughput(server: LiveServer, model: str, streams: int, tokens: int) -> float:
    async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=600) as c:
        t0 = time.perf_counter()
        done = await asyncio.gather(*(one_stream(c, model, i, tokens) for i in range(streams)))
        return sum(done) / (time.perf_counter() - t0)


def front_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def bench_policy(model: str) -> Path:
    """A policy that caps no user's streams and sheds nobody, with moderation off: the
    replicas' engines are measured, not the front's limits or its classifier."""
    path = Path(tempfile.mkdtemp()) / "policy.toml"
    text = BENCH_POLICY.format(model=model, high_water=256) + "\n[moderation]\nenabled = false\n"
    path.write_text(text)
    return path


def measure(model: str, data: Path, urls: list[str], streams: int, tokens: int) -> dict[str, Any]:
    settings = test_settings(
        Path(tempfile.mkdtemp()) / "front",
        model,
        replicas=tuple(urls),
        replica_token=TOKEN,
        local_engine=False,
        max_tokens=tokens,
        policy_path=bench_policy(model),
    )
    empty = ModelRegistry(settings.data_dir / "models", settings.data_dir / "none.toml")
    with LiveServer(settings, empty) as server:
        cpu0 = front_cpu()
        rate = asyncio.run(throughput(server, model, streams, tokens))
        cpu = front_cpu() - cpu0
    return {"tokens_per_s": rate, "front_cpu_ms_per_token": 1000 * cpu / (streams * tokens)}


def failover_gap(model: str, urls: list[str], procs: dict[str, Any], tokens: int) -> float:
    """The longest pause between tokens while the serving replica is killed mid-answer."""
    settings = test_settings(
        Path(tempfile.mkdtemp()) / "front",
        model,
        replicas=tuple(urls),
        replica_token=TOKEN,
        local_engine=False,
        replica_timeout_s=5.0,
        replica_health_s=0.5,
        policy_path=bench_policy(model),
    )
    empty = ModelRegistry(settings.data_dir / "models", settings.data_dir / "none.toml")
    with LiveServer(settings, empty) as server:
        conv = httpx.post(f"{server.url}/v1/conversations", json={}, headers=server.headers)
        body = {"content": "Write a long story.", "max_tokens": tokens * 4}
        last, gap, killed = time.perf_counter(), 0.0, False
        url = f"{server.url}/v1/conversations/{conv.json()['id']}/turns"
        with httpx.stream("POST", url, json=body, headers=server.headers, timeout=120) as resp:
            for line in resp.iter_lines():
                if line.startswith("event: token"):
                    now = time.perf_counter()
                    gap, last = max(gap, now - last) if killed else gap, now
                    if not killed:
                        rows = httpx.get(
                            f"{server.url}/v1/admin/replicas", headers=server.headers
                        ).json()["replicas"]
                        busy = [r["url"] for r in rows if r["running"]]
                        if busy:
                            procs[busy[0]].send_signal(signal.SIGKILL)
                            killed, last = True, time.perf_counter()
                elif line.startswith("event: done") or line.startswith("event: error"):
                    break
    return gap


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    data = Path(tempfile.mkdtemp()) / "replica"
    path = default_model_path() if args.model == "smollm2" else make_tiny_gguf(data / "t.gguf")
    ModelRegistry(data / "models", data / "none.toml").add(
        path, name=args.model, make_default=True, copy=False
    )
    cores = os.cpu_count() or 1
    reps = [start_replica(data, args.model, i % cores) for i in range(2)]
    urls = [u for _, u in reps]
    results: dict[str, Any] = {}
    try:
        for streams in (8, 16):
            one: list[dict[str, Any]] = []
            two: list[dict[str, Any]] = []
            half: list[dict[str, Any]] = []
            for _ in range(args.runs):  # interleaved, so drift hits all alike
                one.append(measure(args.model, data, urls[:1], streams, args.tokens))
                two.append(measure(args.model, data, urls, streams, args.tokens))
                half.append(measure(args.model, data, urls[:1], streams // 2, args.tokens))
            r1 = statistics.median(r["tokens_per_s"] for r in one)
            r2 = statistics.median(r["tokens_per_s"] for r in two)
            ceiling = 2 * statistics.median(r["tokens_per_s"] for r in half)
            cpu = statistics.median(r["front_cpu_ms_per_token"] for r in two)
            results[f"{streams}_streams"] = {
                "one": r1,
                "two": r2,
                "ratio": r2 / r1,
                "ceiling": ceiling,
                "ceiling_ratio": ceiling / r1,
                "front": cpu,
            }
        procs = {u: p for p, u in reps}
        results["failover_gap_s"] = failover_gap(args.model, urls, procs, args.tokens)
    finally:
        for proc, _ in reps:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
    print(f"model {args.model}, {args.tokens} tokens a stream, median of {args.runs} runs")
    print(
        "| streams | 1 replica tok/s | 2 replicas tok/s | ratio | ceiling (2 x 1 replica"
        " at half the streams) | of the ceiling | front CPU ms/token |"
    )
    print("|---|---|---|---|---|---|---|")
    for streams in (8, 16):
        r = results[f"{streams}_streams"]
        print(
            f"| {streams} | {r['one']:.0f} | {r['two']:.0f} | {r['ratio']:.2f}x"
            f" | {r['ceiling']:.0f} ({r['ceiling_ratio']:.2f}x) | {r['two'] / r['ceiling']:.0%}"
            f" | {r['front']:.2f} |"
        )
    print(f"failover stream gap: {results['failover_gap_s']:.2f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
