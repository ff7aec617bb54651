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
import tempfile
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


M_ARENA_MAX = -8  # glibc's mallopt parameter


def limit_malloc_arenas(arenas: int) -> bool:
    """Cap glibc malloc's arenas (mallopt M_ARENA_MAX), before the process starts threads:
    by default every thread that allocates may get its own arena (up to 8 a core), and
    each keeps its own fragments and free memory resident. False where there is no glibc."""
    try:
        fn = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return bool(fn(M_ARENA_MAX, arenas))


def malloc_arenas() -> int:
    """How many arenas glibc's malloc has made in this process (0 where it cannot tell)."""
    try:
        libc = ctypes.CDLL(None)
        info, fdopen, fclose = libc.malloc_info, libc.fdopen, libc.fclose
    except (AttributeError, OSError):
        return 0
    fdopen.restype = ctypes.c_void_p
    fdopen.argtypes = [ctypes.c_int, ctypes.c_char_p]
    info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    fclose.argtypes = [ctypes.c_void_p]
    with tempfile.TemporaryFile() as fh:
        stream = fdopen(os.dup(fh.fileno()), b"w")
        if not stream:
            return 0
        info(0, stream)
        fclose(stream)
        fh.seek(0)
        text = fh.read().decode("ascii", "replace")
    return len(re.findall(r"<heap nr=", text))


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
) -> dict[str, Any]:
    """Rows of (what, bytes) that add up to the process's RSS, with RSS beside them.
    Call `release_free_memory` first: what malloc holds free is then not resident, and the
    last row is memory in use."""
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
    for label, size in estimated:
        take = max(0, min(size, left))
        rows[label] = rows.get(label, 0) + take
        left -= take
    rows["Python heap and other anonymous memory"] = left
    order = sorted(rows.items(), key=lambda kv: -kv[1])
    total = sum(rows.values())
    return {
        "pid": os.getpid(),
        "malloc_arenas": malloc_arenas(),
        "rss_bytes": rss,
        "total_bytes": total,  # the rows' sum, measured apart from RSS
        "other_bytes": rss - total,  # RSS the mappings did not show (should be small)
        "rows": [{"what": k, "bytes": v} for k, v in order],
    }
