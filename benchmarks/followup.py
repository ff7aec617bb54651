"""What a follow-up turn's prefill costs deep in a conversation, in-process, by KV layout.

    python benchmarks/followup.py [--depth 1890] [--reps 8] [--threads 2] [--model PATH]
                                  [--layouts q8_0:flash,f16:flash,f16:plain]

Loads chatbox's serving copy of the default model (the Q8_0 file `chatbox serve` loads on
CPU) into a context laid out as the server's (8 sequences, a KV stream each, n_ubatch 512),
prefills one sequence to --depth tokens, then times one `llama_decode` of 1, 5, 14 and 19
new tokens there (19: the size of a ChatML follow-up, "<|im_end|>\\n<|im_start|>user\\n" +
a short message + the generation prompt; a decode's cost does not depend on which tokens),
and the same 19 in two passes of 5 (the template's part,
what `engine/turns.py` decodes while the person reads) then 14. Each timed decode is rolled
back before the next. Medians over --reps after two untimed rounds, per layout (a KV cache
type and an attention kernel: flash or plain; the contexts take turns round by round), in
milliseconds, and the prefill of the --depth tokens (512 a pass). The questions it answers:
what does each cache cost a follow-up deep in a conversation, and does decoding the
template's part early save a follow-up that comes at once (a script) any time?
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
    """One layout's context with sequence 0 prefilled to `depth` tokens."""

    def __init__(self, model: Model, kv_type: str, flash: bool, depth: int, threads: int) -> None:
        self.ctx = Context(
            model,
            ContextParams(
                n_ctx=8 * 2048,
                n_seq_max=8,
                n_batch=2048,
                n_ubatch=512,
                n_threads=threads,
                flash_attn=flash,
                kv_type=kv_type,
                kv_unified=False,
            ),
        )
        self.batch = Batch(2048)
        self.depth = depth
        self.tokens = model.tokenize(TEXT * (depth // 10 + 1))[:depth]
        self.prefills = [self.prefill() for _ in range(2)]

    def prefill(self) -> float:
        """Seconds to prefill sequence 0 with `depth` tokens, 512 a pass, from empty."""
        self.ctx.seq_rm(0, -1, -1)
        t0 = time.perf_counter()
        for start in range(0, self.depth, 512):
            self.batch.clear()
            for k, tok in enumerate(self.tokens[start : start + 512]):
                self.batch.add(tok, start + k, 0, False)
            self.ctx.decode(self.batch)
        return time.perf_counter() - t0

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
    ap.add_argument(
        "--layouts",
        default="q8_0:flash,f16:flash,f16:plain",
        help="KV type:kernel, comma-separated (a quantized V cache needs flash)",
    )
    args = ap.parse_args()
    layouts = [tuple(x.split(":")) for x in args.layouts.split(",")]
    shipped = Path(args.model) if args.model else default_model()
    path = serving_path(shipped, settings_from_env().cache_dir / "models", enabled=True)
    model = Model(path, n_gpu_layers=0)
    deeps = {
        f"{kv}, {kernel}": Deep(model, kv, kernel == "flash", args.depth, args.threads)
        for kv, kernel in layouts
    }
    times: dict[str, dict[str, list[float]]] = {name: {} for name in deeps}
    try:
        # the layouts take turns round by round: this box's speed drifts over minutes
        for rep in range(args.reps + 2):
            for name, deep in deeps.items():
                for key, dt in deep.round().items():
                    if rep >= 2:
                        times[name].setdefault(key, []).append(dt)
                if rep % 4 == 3:
                    deep.prefills.append(deep.prefill())
    finally:
        for deep in deeps.values():
            deep.close()
        model.close()
    rows = {n: {k: statistics.median(v) * 1000 for k, v in t.items()} for n, t in times.items()}
    keys = [*map(str, SIZES), "5 + 14"]
    print(f"\nms per decode at depth {args.depth} ({path.name}, {args.threads} threads)\n")
    print("| KV, kernel | prefill | " + " | ".join(f"{k} tokens" for k in keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for name, row in rows.items():
        prefill = statistics.median(deeps[name].prefills)
        print(f"| {name} | {prefill:.3f} s | " + " | ".join(f"{row[k]:.1f}" for k in keys) + " |")


if __name__ == "__main__":
    main()
