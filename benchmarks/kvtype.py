"""KV cache types side by side: f16 against q8_0 on SmolLM2's serving copy, in-process.

    python benchmarks/kvtype.py [--pairs 3] [--types f16,q8_0,q8_0/f16:plain] [--history 1800]

Both engines are loaded with the shipped settings (8 slots, n_ctx 16,384, the attention
kernel as the server would choose it: a quantized V cache needs flash attention) and take
turns in interleaved pairs (who goes first alternates), each run: one stream (64 tokens), 8
concurrent streams (64 tokens each), a ~1,800-token history's cold TTFT (nothing cached)
and its follow-up's TTFT (its prefix cached, one new message). Prints each run, the medians,
and each type's KV bytes. The machine is shared: pairs are noisy, compare medians.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.engine import default_model, history, run_streams  # noqa: E402
from chatbox.catalog.requant import serving_path  # noqa: E402
from chatbox.engine.engine import LlamaEngine  # noqa: E402
from chatbox.engine.types import ChatMessage, GenerationRequest, SamplingParams  # noqa: E402
from chatbox.settings import settings_from_env  # noqa: E402


async def history_ttfts(
    engine: LlamaEngine, base: tuple[ChatMessage, ...], key: str
) -> tuple[float, float]:
    """TTFT of the history's cold turn (nothing cached), then of its follow-up turn (the
    history cached, one new message)."""
    turn1 = (*base, ChatMessage("user", "Summarise the points."))
    t0 = time.perf_counter()
    gen = engine.submit(
        GenerationRequest(turn1, SamplingParams(temperature=0, max_tokens=8), key, cache_scope="b")
    )
    texts, cold = [], 0.0
    async for ev in gen:
        cold = cold or time.perf_counter() - t0
        texts.append(getattr(ev, "text", ""))
    answer = "".join(texts)
    turn2 = (*turn1, ChatMessage("assistant", answer), ChatMessage("user", "Shorter?"))
    t0 = time.perf_counter()
    gen = engine.submit(
        GenerationRequest(turn2, SamplingParams(temperature=0, max_tokens=1), key, cache_scope="b")
    )
    ttft = 0.0
    async for _ev in gen:
        ttft = ttft or time.perf_counter() - t0
    return cold, ttft


async def one_run(engine: LlamaEngine, base: tuple[ChatMessage, ...], k: int) -> dict[str, float]:
    await engine.clear_cache()
    one = await run_streams(engine, 1, 64, offset=k * 20)
    eight = await run_streams(engine, 8, 64, offset=k * 20 + 1)
    cold, ttft = await history_ttfts(engine, base, f"conv-{k}")
    return {
        "one_tok_s": one["tok_s"],
        "eight_tok_s": eight["tok_s"],
        "cold_ttft": cold,
        "followup_ttft": ttft,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    path = serving_path(default_model(), settings_from_env().cache_dir / "models")
    shipped = settings_from_env().engine
    base_settings = replace(shipped, kernel_cache=settings_from_env().cache_dir / "kernels.json")
    engines: dict[str, LlamaEngine] = {}
    for kv in args.types.split(","):
        kv_type, _, kernel = kv.partition(":")  # "q8_0/f16:plain": that kernel, not the timed one
        flash = {"plain": False, "flash": True}.get(kernel)
        engine_settings = replace(base_settings, kv_type=kv_type, flash_attn=flash)
        engines[kv] = LlamaEngine(path, f"smollm2-{kv}", engine_settings)
        await engines[kv].start()
        print(
            f"{kv}: flash attention {engines[kv].settings.flash_attn}, KV "
            f"{engines[kv].memory()['kv_bytes'] / 2**20:.0f} MB",
            flush=True,
        )
    runs: dict[str, list[dict[str, float]]] = {kv: [] for kv in engines}
    try:
        first = next(iter(engines.values()))
        base = history(args.history, first)
        for eng in engines.values():  # warm-up
            await run_streams(eng, 2, 8, offset=99)
        for k in range(args.pairs):
            order = list(engines) if k % 2 == 0 else list(engines)[::-1]
            for kv in order:
                r = await one_run(engines[kv], base, k)
                runs[kv].append(r)
                print(
                    f"pair {k + 1} {kv}: 1 stream {r['one_tok_s']:.1f} tok/s, 8 streams "
                    f"{r['eight_tok_s']:.1f} tok/s, cold TTFT {r['cold_ttft'] * 1000:.0f} ms, "
                    f"follow-up TTFT {r['followup_ttft'] * 1000:.0f} ms",
                    flush=True,
                )
    finally:
        for eng in engines.values():
            await eng.stop()
    med: dict[str, dict[str, float]] = {}
    for kv, rs in runs.items():
        med[kv] = {key: statistics.median(r[key] for r in rs) for key in rs[0]}
    print(
        "\n| KV type | KV MB | 1 stream tok/s | 8 streams tok/s | cold TTFT ms"
        " | follow-up TTFT ms |"
    )
    print("|---|---|---|---|---|---|")
    for kv, m in med.items():
        mb = engines[kv].model.kv_bytes(16384, kv.partition(":")[0]) / 2**20
        print(
            f"| {kv} | {mb:.0f} | {m['one_tok_s']:.1f} | {m['eight_tok_s']:.1f} |"
            f" {m['cold_ttft'] * 1000:.0f} | {m['followup_ttft'] * 1000:.0f} |"
        )
    return {"runs": runs, "medians": med}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--types", default="f16,q8_0")
    ap.add_argument("--history", type=int, default=1800)
    ap.add_argument("--watchdog", type=float, default=600, help="print stacks every N s")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "kvtype.json"))
    args = ap.parse_args(argv)
    faulthandler.dump_traceback_later(args.watchdog, repeat=True)
    result = asyncio.run(main_async(args))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), **result}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
