"""Which attention kernel is faster here: timed once per model, machine and build, on the
shapes of a chat load, and remembered.

On CPU with a stream per slot llama.cpp can attend either way, and which one wins depends on
the processor: on one 2-core machine plain attention cost half as much deep in a
conversation, on another flash attention was the faster for new conversations and about even
deeper in. So where the settings and the hardware leave the choice open
(`tuning.attention`), the engine times both kernels, with the KV cache type it serves: one
and 8 streams decoding shallow and deep, and a follow-up turn's prompt in a conversation of
DEEP and of DEEPER tokens, and keeps plain attention unless flash attention's geometric mean
of those times is lower by FLASH_MARGIN. The verdict is kept in a file
(`EngineSettings.kernel_cache`), so only a model's first start on a machine pays (a few
seconds on 2 cores).

Over an f16 cache ggml's CPU flash kernel tiles only prompts of 64 tokens or more and takes
shorter ones a query row at a time over every cell, so deep in a conversation a short
follow-up costs it up to twice plain attention's time (`benchmarks/followup.py`): the
deeper follow-up is timed for that, and a near tie, which on a shared machine is noise,
keeps plain attention.
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import llama_cpp

from chatbox.engine.llama import DECODE_OK, Batch, Context, ContextParams, Model

log = logging.getLogger("chatbox.engine")

SEQS = 8  # streams decoding together in the batched shapes
SHALLOW, DEEP, FOLLOW = 64, 512, 16  # depths of a new and of a long conversation; a prompt
DEEPER = 1536  # a long conversation's follow-up (stream 0 only)
CELLS = 2048  # per stream: DEEPER and a follow-up fit
REPS, WARM = 6, 2  # timed steps per shape (the median is kept), after untimed ones
SHAPES = (
    "1 stream shallow",
    "8 streams shallow",
    "1 stream deep",
    "8 streams deep",
    "follow-up",
    "follow-up deeper",
)
FLASH_MARGIN = 0.9  # flash attention's time ratio to plain must be under this to be kept


def machine_key(model_path: Path, threads: int, kv_type: str = "f16") -> str:
    """What the verdict depends on: the model file, the processor, the build, the threads,
    the KV cache type and the shapes timed."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                cpu += line
    except OSError:
        pass
    st = model_path.stat()
    raw = f"{model_path.resolve()}:{st.st_size}:{st.st_mtime_ns}:{cpu}:{threads}"
    raw += f":{getattr(llama_cpp, '__version__', '')}:{kv_type}:{','.join(SHAPES)}"
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def _decode(ctx: Context, batch: Batch) -> None:
    if ctx.decode(batch) != DECODE_OK:
        raise RuntimeError("llama_decode failed while timing the attention kernels")


def _fill(ctx: Context, batch: Batch, seq: int, start: int, end: int) -> None:
    """Decode filler tokens into seq at positions start..end-1 (the values do not matter:
    the kernels' cost does not depend on them)."""
    for lo in range(start, end, batch.capacity):
        batch.clear()
        hi = min(end, lo + batch.capacity)
        for pos in range(lo, hi):
            batch.add(100 + pos % 50, pos, seq, pos == hi - 1)
        _decode(ctx, batch)


def _steps(ctx: Context, batch: Batch, seqs: int, pos: int, tokens: int) -> float:
    """Median seconds of a step adding `tokens` to each of `seqs` streams at depth pos (each
    step's cells are removed again, so every step sees the same depth)."""
    times = []
    for rep in range(WARM + REPS):
        batch.clear()
        for seq in range(seqs):
            for i in range(tokens):
                batch.add(200 + rep, pos + i, seq, i == tokens - 1)
        t0 = time.perf_counter()
        _decode(ctx, batch)
        if rep >= WARM:
            times.append(time.perf_counter() - t0)
        for seq in range(seqs):
            ctx.seq_rm(seq, pos, -1)
    return statistics.median(times)


def _copy_to_all(ctx: Context) -> None:
    """Every stream holds what stream 0 holds (a copy across streams: no recomputing)."""
    for seq in range(1, SEQS):
        ctx.seq_rm(seq, -1, -1)
        ctx.seq_cp(0, seq, -1, -1)


def time_kernel(
    model: Model, threads: int, flash: bool, ubatch: int, kv_type: str = "f16"
) -> list[float]:
    """Seconds per step of each of SHAPES with one kernel."""
    params = ContextParams(
        n_ctx=SEQS * CELLS,
        n_seq_max=SEQS,
        n_batch=512,
        n_threads=threads,
        n_threads_batch=threads,
        n_ubatch=ubatch,
        flash_attn=flash,
        kv_unified=False,
        kv_type=kv_type,
    )
    ctx = Context(model, params)
    batch = Batch(512)
    try:
        ctx.warm_up()
        _fill(ctx, batch, 0, 0, SHALLOW)
        _copy_to_all(ctx)
        out = [_steps(ctx, batch, 1, SHALLOW, 1), _steps(ctx, batch, SEQS, SHALLOW, 1)]
        _fill(ctx, batch, 0, SHALLOW, DEEP)
        _copy_to_all(ctx)
        out += [_steps(ctx, batch, 1, DEEP, 1), _steps(ctx, batch, SEQS, DEEP, 1)]
        out.append(_steps(ctx, batch, 1, DEEP, FOLLOW))
        _fill(ctx, batch, 0, DEEP, DEEPER)
        return [*out, _steps(ctx, batch, 1, DEEPER, FOLLOW)]
    finally:
        batch.free()
        ctx.close()


def faster_is_flash(plain: list[float], flash: list[float]) -> tuple[bool, float]:
    """Whether flash attention wins (by FLASH_MARGIN), and its geometric-mean time ratio to
    plain attention."""
    ratio = statistics.geometric_mean([f / p for f, p in zip(flash, plain, strict=True)])
    return ratio < FLASH_MARGIN, ratio


def choose(
    model: Model,
    threads: int,
    plain_ubatch: int,
    flash_ubatch: int,
    cache: Path | None,
    kv_type: str = "f16",
) -> bool:
    """True: flash attention is the faster kernel here (timed now or remembered)."""
    key = machine_key(Path(model.path), threads, kv_type)
    known: dict[str, dict[str, object]] = {}
    if cache is not None and cache.is_file():
        try:
            known = json.loads(cache.read_text())
        except (OSError, ValueError):
            known = {}
    entry = known.get(key)
    if isinstance(entry, dict) and isinstance(entry.get("flash"), bool):
        return bool(entry["flash"])
    plain = time_kernel(model, threads, False, plain_ubatch, kv_type)
    flash = time_kernel(model, threads, True, flash_ubatch, kv_type)
    use_flash, ratio = faster_is_flash(plain, flash)
    rows = zip(SHAPES, plain, flash, strict=True)
    table = ", ".join(f"{name} {p * 1e3:.1f}/{f * 1e3:.1f} ms" for name, p, f in rows)
    log.info("attention kernels, plain/flash: %s: flash at %.2fx of plain", table, ratio)
    if cache is not None:
        # forget models that are gone (a deleted model, a test's temporary file)
        known = {
            k: v
            for k, v in known.items()
            if isinstance(v, dict) and Path(str(v.get("model"))).exists()
        }
        known[key] = {
            "flash": use_flash,
            "ratio": round(ratio, 3),
            "plain_ms": [round(t * 1e3, 2) for t in plain],
            "flash_ms": [round(t * 1e3, 2) for t in flash],
            "model": str(model.path),
        }
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(".tmp")
            tmp.write_text(json.dumps(known, indent=1))
            tmp.replace(cache)
        except OSError as exc:
            log.warning("could not remember the attention kernel: %s", exc)
    return use_flash


def choose_apart(timing: Callable[[], bool]) -> bool:
    """`timing` (a bound choose()) on a thread of its own that ends with it (False where
    timing fails).

    libgomp gives every thread that starts a parallel region its own team of workers, kept
    until that thread exits: timed on a pool thread that lives on, the team would outlast
    the timing, and with more workers than cores libgomp stops spinning at barriers, so
    every later step would pay for waking them."""
    out: list[bool] = []

    def run() -> None:
        try:
            out.append(timing())
        except Exception as exc:  # a failed timing must not keep the model from serving
            log.warning("timing the attention kernels failed (plain attention): %s", exc)

    worker = threading.Thread(target=run, name="chatbox-kernel-timing", daemon=True)
    worker.start()
    worker.join()
    return bool(out and out[0])
