"""Where a process's resident memory goes: its mappings (`/proc/<pid>/smaps`) sorted into
model weights, libraries and the rest, with the anonymous memory the engines and the
embedder are known to hold (KV caches, parked KV, encoders) taken out of the heap.

Weights and libraries are measured (file-backed mappings); the KV, parked and encoder rows
are computed from their sizes and capped by the anonymous memory actually resident.
"""

from __future__ import annotations

import ctypes
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# shared-library families worth a row of their own (matched on the mapped file's path)
LIBRARIES = (
    # (not libgomp: llama.cpp's OpenMP runtime is mapped without torch too)
    ("torch libraries", re.compile(r"/(torch|nvidia|triton)/|libtorch")),
    ("ONNX Runtime libraries", re.compile(r"onnxruntime")),
    ("llama.cpp libraries", re.compile(r"llama_cpp|libllama|libggml")),
    ("numpy / scipy / sklearn", re.compile(r"/(numpy|scipy|sklearn)(\.libs)?/")),
)
_HEADER = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")


@dataclass
class Mapping:
    """One mapping of the process: its file (or "[heap]", "" for anonymous) and kB."""

    path: str
    rss_kb: int = 0
    anon_kb: int = 0


@dataclass
class Known:
    """Anonymous memory the caller can account for, and which file is which model."""

    weights: dict[str, str] = field(default_factory=dict)  # file path -> model name
    kv: dict[str, int] = field(default_factory=dict)  # model name -> KV cache bytes
    parked: int = 0  # parked KV held in RAM, bytes
    state_free: int = 0  # KV state memory kept free for the next save, bytes
    encoders: dict[str, int] = field(default_factory=dict)  # row label -> bytes


def read_smaps(pid: int | str = "self") -> list[Mapping]:
    """Every mapping of a process with its resident and anonymous kB."""
    maps: list[Mapping] = []
    with open(f"/proc/{pid}/smaps", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if _HEADER.match(line):
                parts = line.split(None, 5)
                maps.append(Mapping(parts[5].strip() if len(parts) > 5 else ""))
            elif line.startswith("Rss:") and maps:
                maps[-1].rss_kb = int(line.split()[1])
            elif line.startswith("Anonymous:") and maps:
                maps[-1].anon_kb = int(line.split()[1])
    return maps


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
            "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def malloc_free_bytes() -> int:
    """Bytes glibc's malloc holds free in its arenas (0 where mallinfo2 is missing)."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (AttributeError, OSError):
        return 0
    fn.restype = _MallInfo2
    return int(fn().fordblks)


def release_free_memory() -> bool:
    """Hand the memory glibc's malloc holds free back to the system (malloc_trim(0)):
    loading models, encoders and classifiers frees tens of MB that would otherwise stay
    resident. False where there is no glibc."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return False
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return bool(fn(0))


def vm_rss(pid: int | str = "self") -> int:
    """The process's VmRSS in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _file_row(path: str, weights: dict[str, str]) -> str:
    if path in weights:
        return f"model weights: {weights[path]}"
    if ".so" in Path(path).name:
        for label, pattern in LIBRARIES:
            if pattern.search(path):
                return label
        return "other shared libraries"
    if path.endswith(".gguf"):
        return "other GGUF files"
    if path.endswith((".safetensors", ".onnx", ".pt", ".bin")):
        return "torch / ONNX weight files (embeddings, classifiers)"
    return "other mapped files"


def breakdown(
    known: Known,
    maps: list[Mapping] | None = None,
    rss: int | None = None,
    malloc_free: int | None = None,
) -> dict[str, Any]:
    """Rows of (what, bytes) that add up to the process's RSS, with RSS beside them."""
    maps = read_smaps() if maps is None else maps
    rss = vm_rss() if rss is None else rss
    rows: dict[str, int] = {}
    anon = 0
    for m in maps:
        file_kb = m.rss_kb - m.anon_kb  # a private copy of a file page is anonymous
        anon += m.anon_kb * 1024
        if file_kb <= 0:
            continue
        if m.path.startswith("/") and not m.path.startswith("/dev/"):
            label = _file_row(m.path, known.weights)
        elif m.path.startswith("/dev/") or m.path.startswith("/SYSV"):
            label = "shared memory"
        else:
            label = "other anonymous"
        rows[label] = rows.get(label, 0) + file_kb * 1024
    left = anon  # anonymous memory not yet accounted for
    estimated = [(f"KV cache: {name}", size) for name, size in known.kv.items()]
    estimated.append(("parked KV in RAM", known.parked))
    estimated.append(("KV state memory kept for the next save", known.state_free))
    estimated += list(known.encoders.items())
    # freed C memory malloc keeps for reuse (resident where it was touched; malloc_trim returns it)
    free = malloc_free_bytes() if malloc_free is None else malloc_free
    estimated.append(("malloc: freed, held by the allocator", free))
    for label, size in estimated:
        take = max(0, min(size, left))
        rows[label] = rows.get(label, 0) + take
        left -= take
    rows["Python heap and other anonymous memory"] = left
    order = sorted(rows.items(), key=lambda kv: -kv[1])
    total = sum(rows.values())
    return {
        "pid": os.getpid(),
        "rss_bytes": rss,
        "total_bytes": total,  # the rows' sum, measured apart from RSS
        "other_bytes": rss - total,  # RSS the mappings did not show (should be small)
        "rows": [{"what": k, "bytes": v} for k, v in order],
    }
