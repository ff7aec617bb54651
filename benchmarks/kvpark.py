"""Parked KV and prompt-lookup decoding, measured through the engine (not HTTP).

    python benchmarks/kvpark.py [--model PATH] [--history N] [--reps R] [--json OUT]

1. Second-turn TTFT of a conversation with an N-token history, by where its KV is: live in
   the KV cache (warm), parked in host RAM, parked on disk, on disk after an engine restart
   (a new LlamaEngine on the same kv dir), and nowhere (cold). Repeats are interleaved (one
   of each per round) so machine noise hits every row alike; the median is reported.
2. Decode tokens/s with prompt-lookup decoding off and on, for a workload that copies from
   its context (repeat a pasted document / return pasted code with one fix) and for plain
   chat, at 1 and 8 streams; rounds interleave off/on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.engine import default_model, history  # noqa: E402
from chatbox.engine.engine import LlamaEngine  # noqa: E402
from chatbox.engine.types import (  # noqa: E402
    ChatMessage,
    DoneEvent,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from chatbox.settings import EngineSettings  # noqa: E402

FIRST = SamplingParams(temperature=0.0, max_tokens=1)
CODE = "\n".join(
    f"def step_{i}(state, value):\n    total = state.get('total', 0) + value * {i}\n"
    f"    state['total'] = total\n    return state\n"
    for i in range(6)
)
COPY = [
    "Here is my code. Rename `state` to `ctx` everywhere and return the whole file:\n\n" + CODE,
    "Repeat this paragraph word for word: The committee reviewed the quarterly figures, noted "
    "a modest rise in costs, and asked for a short summary of the options before the next "
    "meeting, where the board would decide on the budget for the coming year.",
]
PLAIN = ["Tell me about owls.", "Write a short poem about tea.", "How do glaciers form?"]


async def ttft(engine: LlamaEngine, msgs: tuple[ChatMessage, ...], key: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    req = GenerationRequest(msgs, FIRST, cache_key=key, cache_scope="u")
    first, cached = 0.0, 0
    async for ev in engine.submit(req, ignore_eog=True):
        if isinstance(ev, DoneEvent):
            cached = ev.usage.cached_tokens
            first = first or time.perf_counter() - t0
        elif not first:
            first = time.perf_counter() - t0
    return first, cached


async def parking(model: Path, settings: EngineSettings, n_hist: int, reps: int) -> list[dict]:
    kv = Path(tempfile.mkdtemp(prefix="kvbench-"))
    s = replace(settings, kv_dir=kv)
    rows: dict[str, list[tuple[float, int]]] = {}
    engine = LlamaEngine(model, "m", s)
    await engine.start()
    hist = history(n_hist, engine)
    second = (*hist, ChatMessage("user", "And then?"))
    for r in range(reps):
        key = f"c{r}"

        async def prime(e: LlamaEngine, k: str = key) -> None:
            await ttft(e, hist, k)

        def evict(to_disk: bool, key: str = key) -> object:
            def fn(sched: object) -> None:
                table = sched.slots  # type: ignore[attr-defined]
                for slot in table.slots:
                    if slot.cache_key == key:
                        table._park(slot)
                        table._clear(slot)
                if to_disk:
                    table._drop_parked(key)  # only the disk copy is left

            return fn

        await engine.clear_cache()
        await prime(engine)
        rows.setdefault("warm (live in KV)", []).append(await ttft(engine, second, key))
        await engine.clear_cache()
        await prime(engine)
        await engine.debug_call(evict(False))
        rows.setdefault("parked in RAM", []).append(await ttft(engine, second, key))
        await engine.clear_cache()
        await prime(engine)
        await engine.debug_call(evict(True))
        await engine.debug_call(lambda sc: sc.slots.disk.forget("-").wait())
        rows.setdefault("parked on disk", []).append(await ttft(engine, second, key))
        await engine.clear_cache()
        await prime(engine)
        await engine.stop()  # parks the idle conversation on disk
        engine.close()
        engine = LlamaEngine(model, "m", s)
        await engine.start()
        rows.setdefault("after restart (disk)", []).append(await ttft(engine, second, key))
        await engine.clear_cache()
        rows.setdefault("cold", []).append(await ttft(engine, second, key))
    await engine.stop()
    engine.close()
    out = []
    for name, vals in rows.items():
        out.append(
            {
                "case": name,
                "ttft_ms": statistics.median(v[0] for v in vals) * 1000,
                "cached_tokens": min(v[1] for v in vals),
            }
        )
    return out


async def stream_rate(engine: LlamaEngine, prompts: list[str], n: int, tokens: int) -> float:
    sampling = SamplingParams(temperature=0.0, max_tokens=tokens)
    await engine.clear_cache()
    count = 0

    async def one(i: int) -> None:
        nonlocal count
        msgs = (ChatMessage("user", prompts[i % len(prompts)] + f" (#{i})"),)
        async for ev in engine.submit(GenerationRequest(msgs, sampling), ignore_eog=True):
            if isinstance(ev, DoneEvent):
                count += ev.usage.completion_tokens
            assert not isinstance(ev, TokenEvent) or ev.text is not None

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return count / (time.perf_counter() - t0)


async def lookup(model: Path, settings: EngineSettings, reps: int, tokens: int) -> list[dict]:
    engines = {}
    for name, k in (("off", 0), ("on", settings.lookup_draft or 8)):
        engines[name] = LlamaEngine(model, "m", replace(settings, lookup_draft=k))
        await engines[name].start()
    results: dict[tuple[str, int, str], list[float]] = {}
    for _ in range(reps):
        for work, prompts in (("copy", COPY), ("plain chat", PLAIN)):
            for n in (1, 8):
                for name, engine in engines.items():
                    rate = await stream_rate(engine, prompts, n, tokens)
                    results.setdefault((work, n, name), []).append(rate)
    acc = await engines["on"].debug_call(lambda s: (s.drafted, s.accepted))
    for e in engines.values():
        await e.stop()
        e.close()
    out = []
    for work in ("copy", "plain chat"):
        for n in (1, 8):
            off = statistics.median(results[(work, n, "off")])
            on = statistics.median(results[(work, n, "on")])
            out.append({"workload": work, "streams": n, "off": off, "on": on, "x": on / off})
    out.append({"drafted": acc[0], "accepted": acc[1]})
    return out


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    model = Path(args.model) if args.model else default_model()
    settings = EngineSettings(
        n_parallel=8, n_ctx=8192, n_ctx_per_seq=4096, n_batch=512, idle_kv_cells=1 << 20
    )
    park = await parking(model, settings, args.history, args.reps)
    print(f"\nsecond-turn TTFT, {args.history}-token history (median of {args.reps}, interleaved)")
    print("| where the KV was | TTFT ms | cached tokens |\n|---|---|---|")
    for row in park:
        print(f"| {row['case']} | {row['ttft_ms']:.0f} | {row['cached_tokens']} |")
    look = await lookup(model, settings, args.reps, args.tokens)
    print(f"\nprompt-lookup decoding, tokens/s (median of {args.reps}, off/on interleaved)")
    print("| workload | streams | off | on | speedup |\n|---|---|---|---|---|")
    for row in look[:-1]:
        print(
            f"| {row['workload']} | {row['streams']} | {row['off']:.1f} | {row['on']:.1f} "
            f"| {row['x']:.2f}x |"
        )
    print(f"guesses: {look[-1]['drafted']} drafted, {look[-1]['accepted']} accepted")
    return {"parking": park, "lookup": look}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default=None, help="GGUF path (default: SmolLM2)")
    ap.add_argument("--history", type=int, default=1500, help="history tokens")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96, help="answer tokens per stream")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "kvpark.json"))
    args = ap.parse_args(argv)
    result = asyncio.run(main_async(args))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
