"""Fronts benchmark: what one `chatbox serve` front carries against two on one PostgreSQL
database, before the same two replicas that answer instantly (so the fronts are the limit).

    python benchmarks/fronts.py [--runs 3] [--seconds 8] [--streams 16] [--json OUT]

It starts a throwaway PostgreSQL server (tests/pg.py: `initdb`/`pg_ctl`), two fake replicas
in processes of their own (tests/cluster/fake.py with no pause between tokens) and two
fronts (`chatbox serve --replica … --no-local`, each its own data directory, the same
`CHATBOX_DATABASE_URL`). The client runs `--streams` concurrent conversations through the
conversation API; with two fronts they are dealt to the fronts in turn. Two workloads:
short answers (4 tokens: requests/s, each a stored user turn and answer) and long ones
(256 tokens: streamed tokens/s). One round measures one front, then two (the order swaps
every round); the table gives the medians over `--runs` rounds and the median of the
rounds' ratios. Target: two fronts >= 1.8x one front on a machine with cores to spare;
every process here shares the machine's cores, so run it where nothing else runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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
from tests.pg import PgServer  # noqa: E402
from tests.served import free_port  # noqa: E402
from tests.tinymodel import make_tiny_gguf  # noqa: E402

CACHE = Path(tempfile.gettempdir()) / "chatbox-bench-cache"  # classifiers made once
ADMIN_PASSWORD = "fronts-bench-admin"
FAKE = """
import sys, time
from tests.cluster.fake import FakeReplica
replica = FakeReplica("slow", slots=512, pace_s=0.0)
replica.__enter__()
print(replica.url, flush=True)
while True:
    time.sleep(3600)
"""


def chatbox(data: Path, env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "chatbox", "--data-dir", str(data), *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def start_fake() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", FAKE], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def start_front(
    where: Path, env: dict[str, str], replicas: list[str], gguf: Path
) -> tuple[subprocess.Popen[bytes], str]:
    data = where / "data"
    policy = where / "policy.toml"
    policy.parent.mkdir(parents=True, exist_ok=True)
    policy.write_text(
        BENCH_POLICY.format(model="tiny", high_water=4096) + "\n[moderation]\noutput = false\n"
    )
    chatbox(data, env, "models", "add", str(gguf), "--name", "tiny", "--link", "--default")
    port = free_port()
    args = [sys.executable, "-m", "chatbox", "--data-dir", str(data), "serve"]
    args += ["--port", str(port), "--no-local", "--policy", str(policy), "--log-level", "warning"]
    for url in replicas:
        args += ["--replica", url]
    proc = subprocess.Popen(args, env=env, cwd=ROOT, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit("a front exited while starting")
        time.sleep(0.3)
    proc.kill()
    raise SystemExit("a front did not become ready")


async def worker(
    client: httpx.AsyncClient, url: str, key: str, tokens: int, until: float, out: list[int]
) -> None:
    """Turns in a conversation of its own (a new one every 20) until `until`."""
    headers = {"Authorization": f"Bearer {key}"}
    conv = ""
    turns = 0
    while time.monotonic() < until:
        if turns % 20 == 0:
            resp = await client.post(url + "/v1/conversations", headers=headers, json={})
            conv = resp.json()["id"]
        turns += 1
        body = {"content": f"question {turns}", "max_tokens": tokens}
        got = 0
        async with client.stream(
            "POST", f"{url}/v1/conversations/{conv}/turns", headers=headers, json=body
        ) as resp:
            if resp.status_code != 200:
                await resp.aread()
                raise SystemExit(f"a turn failed: {resp.status_code} {resp.text[:200]}")
            async for chunk in resp.aiter_bytes():
                got += chunk.count(b"event: token")
        out[0] += 1
        out[1] += got


async def warm(url: str, key: str) -> None:
    async with httpx.AsyncClient(timeout=600) as client:
        await worker(client, url, key, 4, time.monotonic() + 0.001, [0, 0])


async def measure(fronts: list[str], key: str, streams: int, tokens: int, seconds: float) -> Any:
    """Requests/s and streamed tokens/s of `streams` conversations dealt over `fronts`."""
    limits = httpx.Limits(max_connections=streams * 2, max_keepalive_connections=streams * 2)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        counts = [[0, 0] for _ in range(streams)]
        until = time.monotonic() + 1.0  # warm: connections, conversations
        await asyncio.gather(
            *(
                worker(client, fronts[i % len(fronts)], key, tokens, until, [0, 0])
                for i in range(streams)
            )
        )
        t0 = time.monotonic()
        until = t0 + seconds
        await asyncio.gather(
            *(
                worker(client, fronts[i % len(fronts)], key, tokens, until, counts[i])
                for i in range(streams)
            )
        )
        spent = time.monotonic() - t0
    return sum(c[0] for c in counts) / spent, sum(c[1] for c in counts) / spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="chatbox-fronts-bench-"))
    CACHE.mkdir(exist_ok=True)
    pg = PgServer().start()
    procs: list[subprocess.Popen[Any]] = []
    try:
        db = pg.fresh_database()
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHATBOX_")}
        env.update(
            CHATBOX_DATABASE_URL=db,
            CHATBOX_ADMIN_PASSWORD=ADMIN_PASSWORD,
            CHATBOX_CACHE_DIR=str(CACHE),
        )
        gguf = make_tiny_gguf(work / "tiny.gguf")
        replicas = []
        for _ in range(2):
            proc, url = start_fake()
            procs.append(proc)
            replicas.append(url)
        fronts = []
        for name in ("a", "b"):
            proc, url = start_front(work / name, env, replicas, gguf)
            procs.append(proc)
            fronts.append(url)
        data = work / "a" / "data"
        chatbox(data, env, "users", "add", "bench", "--tier", "paid", "--password", "bench" * 3)
        key = chatbox(data, env, "keys", "create", "--user", "bench").strip().splitlines()[-1]
        for url in fronts:  # first turns load the embedder and classifiers: not measured
            asyncio.run(warm(url, key))
        rows: dict[str, dict[int, list[float]]] = {"requests/s": {}, "tokens/s": {}}
        for run in range(args.runs):
            order = [1, 2] if run % 2 == 0 else [2, 1]
            for n in order:
                rps, _ = asyncio.run(measure(fronts[:n], key, args.streams, 4, args.seconds))
                _, tps = asyncio.run(measure(fronts[:n], key, args.streams, 256, args.seconds))
                rows["requests/s"].setdefault(n, []).append(rps)
                rows["tokens/s"].setdefault(n, []).append(tps)
                print(f"run {run + 1}, {n} front(s): {rps:.1f} requests/s, {tps:.0f} tokens/s")
        print(
            f"\n{args.streams} concurrent conversations, median of {args.runs} interleaved rounds"
        )
        print("| carried | one front | two fronts | ratio (median of rounds) |")
        print("|---|---|---|---|")
        result: dict[str, Any] = {"streams": args.streams, "runs": args.runs}
        for name, by in rows.items():
            one, two = statistics.median(by[1]), statistics.median(by[2])
            ratio = statistics.median(b / a for a, b in zip(by[1], by[2], strict=True))
            digits = 1 if name == "requests/s" else 0
            print(f"| {name} | {one:.{digits}f} | {two:.{digits}f} | {ratio:.2f}x |")
            result[name] = {"one": by[1], "two": by[2], "ratio": ratio}
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        pg.stop()


if __name__ == "__main__":
    main()
