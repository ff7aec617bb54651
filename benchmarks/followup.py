"""What a follow-up turn's prefill costs deep in a conversation, in-process, by kernel.

    python benchmarks/followup.py [--depth 1890] [--reps 8] [--threads 2] [--model PATH]

Loads chatbox's serving copy of the default model (the Q8_0 file `chatbox serve` loads on
CPU) into a context laid out as the server's (8 sequences, a KV stream each, n_ubatch 512),
prefills one sequence to --depth tokens, then times one `llama_decode` of 1, 5, 14 and 19
new tokens there (19: the size of a ChatML follow-up, "<|im_end|>\\n<|im_start|>user\\n" +
a short message + the generation prompt; a decode's cost does not depend on which tokens),
and the same 19 in two passes of 5 (the template's part,
what `engine/turns.py` decodes while the person reads) then 14. Each timed decode is rolled
back before the next. Medians over --reps after two untimed rounds, per kernel (flash
attention, plain; the two contexts take turns round by round), in milliseconds. The
question it answers: does decoding the template's part early save a follow-up that comes
at once (a script) any time?
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.engine import default_model  # noqa: E402
from chatbox.catalog.requant import serving_path  # noqa: E402
from chatbox.engine.llama import Batch, Context, ContextParams, Model  # noqa: E402
from chatbox.settings import settings_from_env  # noqa: E402

SIZES = (1, 5, 14, 19)
TEXT = "The quick brown fox jumps over the lazy dog, and the dog does not mind at all. "


class Deep:
    """One kernel's context with sequence 0 prefilled to `depth` tokens."""

    def __init__(self, model: Model, flash: bool, depth: int, threads: int) -> None:
        self.ctx = Context(
            model,
            ContextParams(
                n_ctx=8 * 2048,
                n_seq_max=8,
                n_batch=2048,
                n_ubatch=512,
                n_threads=threads,
                flash_attn=flash,
                kv_unified=False,
            ),
        )
        self.batch = Batch(2048)
        self.depth = depth
        self.tokens = model.tokenize(TEXT * (depth // 10 + 1))[:depth]
        for start in range(0, depth, 512):
            self.batch.clear()
            for k, tok in enumerate(self.tokens[start : start + 512]):
                self.batch.add(tok, start + k, 0, False)
            self.ctx.decode(self.batch)

    def decode(self, n: int, at: int) -> float:
        """Seconds for one decode of `n` new tokens at position `at`."""
        self.batch.clear()
        for k in range(n):
            self.batch.add(self.tokens[k], at + k, 0, k == n - 1)
        t0 = time.perf_counter()
        self.ctx.decode(self.batch)
        return time.perf_counter() - t0

    def round(self) -> dict[str, float]:
        """One timing of each size and of the split, each rolled back after."""
        out: dict[str, float] = {}
        for n in SIZES:
            out[str(n)] = self.decode(n, self.depth)
            self.ctx.seq_rm(0, self.depth, -1)
        out["5 + 14"] = self.decode(5, self.depth) + self.decode(14, self.depth + 5)
        self.ctx.seq_rm(0, self.depth, -1)
        return out

    def close(self) -> None:
        self.batch.free()
        self.ctx.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a GGUF file (default: SmolLM2's serving copy)")
    ap.add_argument("--depth", type=int, default=1890, help="tokens already in the sequence")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    shipped = Path(args.model) if args.model else default_model()
    path = serving_path(shipped, settings_from_env().cache_dir / "models", enabled=True)
    model = Model(path, n_gpu_layers=0)
    deeps = {flash: Deep(model, flash, args.depth, args.threads) for flash in (True, False)}
    times: dict[bool, dict[str, list[float]]] = {True: {}, False: {}}
    try:
        # the kernels take turns round by round: this box's speed drifts over minutes
        for rep in range(args.reps + 2):
            for flash, deep in deeps.items():
                for key, dt in deep.round().items():
                    if rep >= 2:
                        times[flash].setdefault(key, []).append(dt)
    finally:
        for deep in deeps.values():
            deep.close()
        model.close()
    rows = {f: {k: statistics.median(v) * 1000 for k, v in t.items()} for f, t in times.items()}
    keys = [*map(str, SIZES), "5 + 14"]
    print(f"\nms per decode at depth {args.depth} ({path.name}, {args.threads} threads)\n")
    print("| kernel | " + " | ".join(f"{k} tokens" for k in keys) + " |")
    print("|---|" + "---|" * len(keys))
    for flash, row in rows.items():
        name = "flash" if flash else "plain"
        print(f"| {name} | " + " | ".join(f"{row[k]:.2f}" for k in keys) + " |")


if __name__ == "__main__":
    main()
