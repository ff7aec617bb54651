"""A batch-friendly copy of a GGUF for serving on CPU.

llama.cpp's CPU backend multiplies a batch of tokens by quantized weights with real matrix
kernels (tinyBLAS, repacked layouts) only for some weight types; Q4_1 and Q5_1 fall back to
one dot product per token, so decoding 8 streams together gains little over one. The
default model ships as Q4_1. Re-quantized to Q8_0 its weights keep their values to within
a fraction of one Q4_1 step (a Q4_1 block has 16 levels, Q8_0 has 255), and batching pays:
benchmarks/engine.py measures both files. The copy is derived data, so it lives in the cache
directory, keyed by the source's path, size and mtime; serving the original is always a
correct fallback.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from pathlib import Path

from chatbox.catalog.gguf import InvalidModelFile, read_model_file

log = logging.getLogger(__name__)

SLOW_BATCHING_ON_CPU = frozenset({"Q4_1", "Q5_1"})
TARGET = "Q8_0"


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def _prefix(source: Path) -> str:
    """The part of a copy's name that stays the same while the source file changes."""
    return f"{source.stem}.{_digest(str(source.resolve()))}."


def copy_path(source: Path, cache_dir: Path) -> Path:
    """Where the served copy of `source` lives (changes when the source file does)."""
    st = source.stat()
    return cache_dir / f"{_prefix(source)}{_digest(f'{st.st_size}:{st.st_mtime_ns}')}.{TARGET}.gguf"


def _drop_stale(source: Path, current: Path) -> None:
    """Delete copies of earlier versions of `source` (a process still using one keeps its
    mapping: unlinking does not pull the file from under it)."""
    for old in current.parent.glob(f"{_prefix(source)}*.{TARGET}.gguf"):
        if old != current:
            with contextlib.suppress(OSError):
                old.unlink()


def serving_path(
    source: Path, cache_dir: Path, *, enabled: bool = True, n_gpu_layers: int = 0
) -> Path:
    """The file to load for `source`: a cached Q8_0 copy where that batches better on CPU."""
    from chatbox.engine.llama import quantize, supports_gpu_offload  # loads llama.cpp

    if not enabled or (n_gpu_layers != 0 and supports_gpu_offload()):
        return source  # GPU kernels batch every type well
    try:
        quant = read_model_file(source).quantization
    except InvalidModelFile:
        return source  # let the loader report it
    if quant not in SLOW_BATCHING_ON_CPU:
        return source
    target = copy_path(source, cache_dir)
    if target.exists():
        return target
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        quantize(source, tmp, TARGET)
        read_model_file(tmp)
        os.replace(tmp, target)  # atomic: another process may be making the same copy
        _drop_stale(source, target)
    except Exception as exc:  # a full disk or read-only cache must not stop serving
        log.warning("serving %s as is: could not write a %s copy (%s)", source.name, TARGET, exc)
        return source
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    log.info(
        "serving %s (%s) as a %s copy for CPU batching: %s", source.name, quant, TARGET, target
    )
    return target
