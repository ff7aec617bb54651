"""Prompt-lookup decoding, measured through the engine (not HTTP).

    python benchmarks/lookup.py [--model PATH] [--reps R] [--tokens N] [--json OUT]

Decode tokens/s with prompt-lookup decoding off and on, for a workload that copies from its
context (repeat a pasted document / return pasted code with one fix) and for plain chat, at
1 and 8 streams; rounds interleave off/on (alternating which goes first) so machine noise hits
both alike; the speedup is the median of the pairs' ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.engine import default_model  # noqa: E402
from chatbox.engine.engine import LlamaEngine  # noqa: E402
from chatbox.engine.types import (  # noqa: E402
    ChatMessage,
    DoneEvent,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from chatbox.settings import EngineSettings, settings_from_env  # noqa: E402

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
    # One engine, its lookup switched between runs: with two engines side by side, the one
    # loaded second measured a few percent slower whichever it was (cause not isolated).
    k = settings.lookup_draft or 8
    engine = LlamaEngine(model, "m", replace(settings, lookup_draft=k))
    await engine.start()
    draft = {"off": 0, "on": k}

    def switch(value: int) -> Callable[[Any], None]:
        return lambda s: setattr(s, "lookup_draft", value)  # read as each request starts

    results: dict[tuple[str, int, str], list[float]] = {}
    for rep in range(reps):
        order = ("off", "on") if rep % 2 == 0 else ("on", "off")  # neither side always first
        for work, prompts in (("copy", COPY), ("plain chat", PLAIN)):
            for n in (1, 8):
                for name in order:
                    await engine.debug_call(switch(draft[name]))
                    rate = await stream_rate(engine, prompts, n, tokens)
                    results.setdefault((work, n, name), []).append(rate)
    acc = await engine.debug_call(lambda s: (s.drafted, s.accepted))
    await engine.stop()
    engine.close()
    out = []
    for work in ("copy", "plain chat"):
        for n in (1, 8):
            offs, ons = results[(work, n, "off")], results[(work, n, "on")]
            ratios = [a / b for a, b in zip(ons, offs, strict=True)]
            out.append(
                {
                    "workload": work,
                    "streams": n,
                    "off": statistics.median(offs),
                    "on": statistics.median(ons),
                    "x": statistics.median(ratios),  # of the interleaved pairs' ratios
                    "x_range": [min(ratios), max(ratios)],
                }
            )
    out.append({"drafted": acc[0], "accepted": acc[1]})
    return out


async def main_async(args: argparse.Namespace) -> list[dict]:
    model = Path(args.model) if args.model else default_model()
    settings = EngineSettings(n_parallel=8, n_ctx=8192, n_ctx_per_seq=4096, n_batch=512)
    # the attention kernel the server would use on this machine (timed once, remembered)
    settings = replace(settings, kernel_cache=settings_from_env().cache_dir / "kernels.json")
    look = await lookup(model, settings, args.reps, args.tokens)
    print(f"\nprompt-lookup decoding, tokens/s (median of {args.reps}, off/on interleaved)")
    print("| workload | streams | off | on | speedup | pairs' range |\n|---|---|---|---|---|---|")
    for row in look[:-1]:
        lo, hi = row["x_range"]
        print(
            f"| {row['workload']} | {row['streams']} | {row['off']:.1f} | {row['on']:.1f} "
            f"| {row['x']:.2f}x | {lo:.2f}-{hi:.2f} |"
        )
    print(f"guesses: {look[-1]['drafted']} drafted, {look[-1]['accepted']} accepted")
    return look


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default=None, help="GGUF path (default: SmolLM2)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96, help="answer tokens per stream")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "lookup.json"))
    args = ap.parse_args(argv)
    result = asyncio.run(main_async(args))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
