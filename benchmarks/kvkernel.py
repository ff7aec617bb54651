"""A decode step's cost by KV cache layout, in-process: f16 against quantized keys/values.

    python benchmarks/kvkernel.py [--depth 400] [--reps 7] [--threads 2]

Loads chatbox's serving copy of the default model into contexts laid out as the server's (8
sequences, a KV stream each, 2,048 cells a stream) with each KV layout (K/V types, flash or
plain attention), prefills all 8 sequences to --depth tokens, then times one `llama_decode`
of one token (one stream) and of 8 tokens, one a sequence (8 streams), each rolled back
after. The layouts take turns round by round; medians over --reps after one untimed round,
in milliseconds, beside each layout's KV bytes. The machine is shared: compare medians.
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

TEXT = "The quick brown fox jumps over the lazy dog, and the dog does not mind at all. "
LAYOUTS = [("f16", False), ("f16", True), ("q8_0/f16", False), ("q8_0/f16", True), ("q8_0", True)]
SEQS = 8


class Layout:
    def __init__(self, model: Model, kv: str, flash: bool, depth: int, threads: int) -> None:
        self.name = f"{kv} {'flash' if flash else 'plain'}"
        self.kv = kv
        self.ctx = Context(
            model,
            ContextParams(
                n_ctx=SEQS * 2048,
                n_seq_max=SEQS,
                n_batch=512,
                n_ubatch=512 if flash else 256,
                n_threads=threads,
                flash_attn=flash,
                kv_type=kv,
                kv_unified=False,
            ),
        )
        self.batch = Batch(512)
        self.depth = depth
        self.tokens = model.tokenize(TEXT * (depth // 10 + 1))[:depth]
        for seq in range(SEQS):
            for start in range(0, depth, 256):
                self.batch.clear()
                for k, tok in enumerate(self.tokens[start : start + 256]):
                    self.batch.add(tok, start + k, seq, False)
                self.ctx.decode(self.batch)

    def step(self, seqs: int) -> float:
        self.batch.clear()
        for seq in range(seqs):
            self.batch.add(self.tokens[seq], self.depth, seq, True)
        t0 = time.perf_counter()
        self.ctx.decode(self.batch)
        took = time.perf_counter() - t0
        for seq in range(seqs):
            self.ctx.seq_rm(seq, self.depth, -1)
        return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--depth", type=int, default=400)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    path = serving_path(default_model(), settings_from_env().cache_dir / "models")
    model = Model(path, n_gpu_layers=0)
    layouts = [Layout(model, kv, fa, args.depth, args.threads) for kv, fa in LAYOUTS]
    times: dict[str, dict[int, list[float]]] = {x.name: {1: [], SEQS: []} for x in layouts}
    for rep in range(args.reps + 1):
        order = layouts if rep % 2 == 0 else layouts[::-1]
        for x in order:
            for seqs in (1, SEQS):
                took = x.step(seqs)
                if rep:
                    times[x.name][seqs].append(took)
    print(f"\n{path.name}, {args.threads} threads, {SEQS} streams {args.depth} tokens deep")
    print("| KV layout | KV MB | 1 stream step ms | 8 streams step ms |")
    print("|---|---|---|---|")
    for x in layouts:
        mb = kv_mb(model, x.kv)
        one, eight = (statistics.median(times[x.name][n]) * 1000 for n in (1, SEQS))
        print(f"| {x.name} | {mb:.0f} | {one:.1f} | {eight:.1f} |")
    for x in layouts:
        x.batch.free()
        x.ctx.close()


def kv_mb(model: Model, kv: str) -> float:
    k, _, v = kv.partition("/")
    return (model.kv_bytes(SEQS * 2048, k) + model.kv_bytes(SEQS * 2048, v or k)) / 2 / 2**20


if __name__ == "__main__":
    main()
