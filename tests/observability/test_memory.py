"""The memory breakdown's arithmetic on given mappings (what `chatbox doctor` prints)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from chatbox.observability.memory import Known, Mapping, breakdown, release_free_memory

MB = 2**20


def test_rows_sort_files_and_take_known_parts_out_of_the_heap_capped_by_what_is_resident() -> None:
    maps = [
        Mapping("/srv/models/smollm2.gguf", rss_kb=100 * 1024),
        Mapping("/venv/site-packages/llama_cpp/lib/libllama.so", rss_kb=5 * 1024),
        Mapping("/venv/site-packages/torch/lib/libtorch_cpu.so", rss_kb=80 * 1024),
        Mapping("[heap]", rss_kb=300 * 1024, anon_kb=300 * 1024),
        Mapping("", rss_kb=200 * 1024, anon_kb=200 * 1024),
    ]
    known = Known(
        weights={"/srv/models/smollm2.gguf": "smollm2"},
        kv={"smollm2": 400 * MB, "gemma": 400 * MB},  # more than is resident
        encoders={"embeddings: exact graph": 50 * MB},
    )
    report = breakdown(known, maps, rss=700 * MB)
    rows = {r["what"]: r["bytes"] for r in report["rows"]}
    assert rows["model weights: smollm2"] == 100 * MB
    assert rows["llama.cpp libraries"] == 5 * MB and rows["torch libraries"] == 80 * MB
    assert rows["KV cache: smollm2"] == 400 * MB
    assert rows["KV cache: gemma"] == 100 * MB  # only what anonymous memory had left
    assert rows["embeddings: exact graph"] == 0
    assert rows["Python heap and other anonymous memory"] == 0
    assert report["total_bytes"] == 685 * MB and report["other_bytes"] == 15 * MB


def test_memory_freed_inside_the_heap_goes_back_to_the_system() -> None:
    blocks = [bytearray(4096) for _ in range(20_000)]  # 80 MB from malloc's arenas
    pin = [bytearray(4096) for _ in range(16)]  # above them: free() alone cannot shrink the heap
    del blocks
    assert release_free_memory()  # malloc_trim handed pages back
    assert pin


THREADS_ALLOCATING = """
import ctypes, sys, threading
from chatbox.observability.memory import limit_malloc_arenas, malloc_arenas
if sys.argv[1] != "0":
    limit_malloc_arenas(int(sys.argv[1]))
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
both = threading.Barrier(12)  # all twelve threads allocate at once
def work():
    both.wait()
    held = [libc.malloc(1000) for _ in range(100)]
    both.wait()
threads = [threading.Thread(target=work) for _ in range(12)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(malloc_arenas())
"""


def test_malloc_arenas_are_capped_before_threads_allocate() -> None:
    def arenas(cap: int) -> int:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(THREADS_ALLOCATING), str(cap)],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        return int(done.stdout.strip())

    assert arenas(0) > 2  # glibc's default: threads that allocate at once get arenas of their own
    assert arenas(2) == 2
