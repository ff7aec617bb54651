"""Overhead of observability: tokens/s at 8 concurrent streams and TTFT, with tracing and
app metrics on vs off (CHATBOX_TELEMETRY), median of three interleaved pairs.

    python benchmarks/observability.py [--streams 8] [--pairs 3] [--max-tokens 96]

Each run starts a fresh server (SmolLM2, the default model) in this process on a free port,
warms it with one turn, then runs `streams` conversations at once through the conversation
API (the full turn path: gateway, admission, retrieval, engine, store), each answering
`max-tokens` tokens. Runs alternate off/on (then on/off) so drift hits both sides.
Target: with telemetry on, tokens/s >= 95% of off and TTFT p50 within 5%.
Results go to benchmarks/results/observability.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
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

PASSWORD = "bench-admin-password"
POLICY = """
[tiers.paid]
rpm = 0
tpm = 0
max_streams = 64
model = "smollm2"
overload = "queue"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(data_dir: Path, telemetry: bool, streams: int, max_tokens: int) -> tuple[Any, str]:
    """A started uvicorn server in a thread; (server, admin API key)."""
    import uvicorn

    from chatbox.app import create_app
    from chatbox.catalog.registry import ModelRegistry
    from chatbox.settings import EngineSettings, Settings
    from chatbox.store import Store

    policy = data_dir / "policy.toml"
    data_dir.mkdir(parents=True, exist_ok=True)
    policy.write_text(POLICY)
    settings = Settings(
        data_dir=data_dir,
        model="smollm2",
        max_tokens=max_tokens,
        admin_password=PASSWORD,
        policy_path=policy,
        telemetry=telemetry,
        engine=EngineSettings(n_parallel=streams, n_ctx=streams * 1024, n_ctx_per_seq=1024),
    )
    settings.ensure_dirs()
    registry = ModelRegistry(settings.models_path)

    async def key() -> str:
        from chatbox.accounts import ensure_admin

        store = await Store.open(settings.db_path)
        try:
            await ensure_admin(store, settings)
            admin = await store.users.get_by_name("admin")
            assert admin is not None
            await store.users.set_tier(admin.id, "paid")
            _, secret = await store.keys.create(admin.id, "bench")
            return secret
        finally:
            await store.close()

    secret = asyncio.run(key())
    port = free_port()
    config = uvicorn.Config(
        create_app(settings, registry), host="127.0.0.1", port=port, log_level="warning"
    )
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    server.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    return server, secret


async def one_turn(client: httpx.AsyncClient, text: str) -> tuple[float, int, float]:
    """(TTFT s, tokens, total s) of one streamed turn."""
    conv = (await client.post("/v1/conversations", json={})).json()["id"]
    t0 = time.perf_counter()
    ttft = 0.0
    tokens = 0
    async with client.stream(
        "POST", f"/v1/conversations/{conv}/turns", json={"content": text}
    ) as r:
        event = ""
        async for line in r.aiter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:") and event == "done":
                tokens = json.loads(line[5:])["usage"]["completion_tokens"]
            elif line.startswith("data:") and event == "token" and not ttft:
                ttft = time.perf_counter() - t0
    return ttft, tokens, time.perf_counter() - t0


async def load(url: str, key: str, streams: int) -> dict[str, float]:
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300) as c:
        await one_turn(c, "Say hello.")  # warm: the model is loaded, the template probed
        t0 = time.perf_counter()
        results = await asyncio.gather(
            *(one_turn(c, f"Write a long story about topic {i}.") for i in range(streams))
        )
        wall = time.perf_counter() - t0
    ttfts = sorted(r[0] for r in results)
    return {
        "tokens_per_s": sum(r[1] for r in results) / wall,
        "ttft_p50_s": statistics.median(ttfts),
        "ttft_max_s": ttfts[-1],
    }


def run(telemetry: bool, streams: int, max_tokens: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="chatbox-obs-") as tmp:
        server, key = serve(Path(tmp) / "data", telemetry, streams, max_tokens)
        try:
            return asyncio.run(load(server.url, key, streams))
        finally:
            server.should_exit = True
            time.sleep(1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args()
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for i in range(args.pairs):
        for telemetry in (False, True) if i % 2 == 0 else (True, False):
            r = run(telemetry, args.streams, args.max_tokens)
            runs[telemetry].append(r)
            print(f"pair {i + 1} telemetry={'on ' if telemetry else 'off'} {r}", flush=True)
    med = {on: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for on, rs in runs.items()}
    off, on = med[False], med[True]
    ratio = on["tokens_per_s"] / off["tokens_per_s"]
    print(f"\n{'':24}{'off':>10}{'on':>10}{'on/off':>10}")
    for k in ("tokens_per_s", "ttft_p50_s", "ttft_max_s"):
        print(f"{k:24}{off[k]:10.3f}{on[k]:10.3f}{on[k] / off[k]:10.3f}")
    print(f"\ntokens/s with telemetry on: {ratio:.1%} of off (target >= 95%)")
    out = ROOT / "benchmarks" / "results" / "observability.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "args": vars(args),
                "runs": {str(k): v for k, v in runs.items()},
                "median": {"off": off, "on": on},
                "ratio": ratio,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
