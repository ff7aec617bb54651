"""Where `chatbox serve` spends CPU per token outside llama.cpp: py-spy samples the server
while peer.py's load runs, and the table gives each function's share of the serving threads'
time (every thread but llama.cpp's compute) as milliseconds per streamed token.

    pip install py-spy   # not a dependency of chatbox
    python benchmarks/serving_profile.py [--streams 1|8] [--seconds 40] [--as-shipped]

The server is started as peer.py starts it (its policy, 8 slots, moderation off unless
--as-shipped). The compute thread is the engine's step loop, which calls llama_decode (its
Python work is left out with it, as peer.py's column leaves out the busiest threads); the
rest are the serving threads. `self` is time in
the function itself, `total` with what it calls.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peer

# The engine's step loop: the thread that calls llama_decode (llama.cpp's first compute
# thread, whose Python work peer.py's column leaves out with it); the others are native.
COMPUTE_MARKERS = ("Scheduler._run (",)


def parse_raw(path: Path) -> dict[str, Counter[tuple[str, ...]]]:
    """py-spy's raw output (`thread;frame;…;frame count`): stacks per thread, root first."""
    threads: dict[str, Counter[tuple[str, ...]]] = defaultdict(Counter)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        threads[frames[0]][tuple(frames[1:])] += int(count)
    return threads


def is_compute(stacks: Counter[tuple[str, ...]]) -> bool:
    total = sum(stacks.values())
    inside = sum(n for s, n in stacks.items() if any(m in f for f in s for m in COMPUTE_MARKERS))
    return total > 0 and inside / total > 0.5


def short(frame: str) -> str:
    """`fn (path/to/module.py:12)` as `fn (module.py)`."""
    name, _, where = frame.partition(" (")
    return f"{name} ({Path(where.split(':')[0]).name})" if where else name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, choices=(1, 8), default=1)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--rate", type=int, default=250, help="samples a second")
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--as-shipped", action="store_true")
    args = ap.parse_args(argv)
    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("py-spy is not installed: pip install py-spy")
    load = argparse.Namespace(
        moderation=False,
        as_shipped=args.as_shipped,
        slots=8,
        n_ctx=16384,
        threads=0,
        chatbox_arg=[],
        max_tokens=64,
    )
    work = Path(tempfile.mkdtemp(prefix="chatbox-profile-"))
    server = peer.start_chatbox(load, work)
    phase = "serial" if args.streams == 1 else "concurrent"
    out = work / "profile.txt"
    tokens = 0
    try:
        asyncio.run(peer.run_phase(server, load, phase))  # untimed: a fresh process
        peer.settle([server])
        sampling = ["--rate", str(args.rate), "--duration", str(int(args.seconds))]
        raw = ["--format", "raw", "--threads", "--nonblocking", "--output", str(out)]
        record = subprocess.Popen(
            [spy, "record", "--pid", str(server.proc.pid), *sampling, *raw],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        done = threading.Event()

        def until_recorded() -> None:
            record.wait()
            done.set()

        threading.Thread(target=until_recorded, daemon=True).start()
        start = time.monotonic()
        while not done.is_set():
            result = asyncio.run(peer.run_phase(server, load, phase))
            tokens += int(result[f"{phase}_tokens_per_answer"] * load.slots)
        # The last part runs past the sampling: count the tokens of the sampled seconds.
        tokens = round(tokens * args.seconds / (time.monotonic() - start))
    finally:
        server.stop()
    threads = parse_raw(out)
    serving = {t: s for t, s in threads.items() if not is_compute(s)}
    per_token = 1000.0 / args.rate / max(tokens, 1)  # ms of CPU a sample stands for, a token
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for stacks in serving.values():
        for stack, n in stacks.items():
            if stack:
                own[short(stack[-1])] += n
            for frame in {short(f) for f in stack}:
                total[frame] += n
    samples = sum(sum(s.values()) for s in serving.values())
    print(f"\n{tokens} tokens streamed while sampled; serving threads {len(serving)} of")
    print(f"{len(threads)}; {samples * per_token:.3f} ms of serving CPU a token\n")
    print("| function (self) | ms/token | | function (total) | ms/token |")
    print("|---|---|---|---|---|")
    for (a, na), (b, nb) in zip(
        own.most_common(args.rows), total.most_common(args.rows), strict=False
    ):
        print(f"| {a} | {na * per_token:.3f} | | {b} | {nb * per_token:.3f} |")
    print(f"\nraw samples in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
