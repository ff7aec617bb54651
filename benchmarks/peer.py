"""chatbox side by side with llama-server: the same file, threads and load, as ratios.

    python benchmarks/peer.py [--pairs 3] [--threads N] [--max-tokens 64] [--json OUT]

1. builds llama-server once from the llama.cpp source vendored in the sdist of the installed
   llama-cpp-python version, with the same CPU flags (GGML_NATIVE=OFF, AVX2, FMA, F16C),
   cached under ~/.cache/chatbox/peer/<version>/ (about 8 minutes on 2 cores);
2. starts both servers on chatbox's serving copy of the default model (the Q8_0 file
   `chatbox serve` loads on CPU), 8 slots and `-c`/`--n-ctx` 16,384 each (with a stream per
   slot both split it 2,048 a slot); chatbox with a policy
   that does not cap one user's streams and no moderation (llama-server has none;
   --moderation keeps chatbox's default in and out checks); llama-server with `-t` = the
   cores (for one-token steps and batches alike), chatbox with its defaults unless --threads;
3. runs the same load through the official `openai` client against each, in interleaved
   pairs: one stream (8 requests one after another), 8 concurrent streams, and a
   ~1,800-token history: the cold turn's and its follow-up turn's TTFT (sent at once, as a
   script would), then a third turn's after a pause (--pause, 2 s: a person reading the
   answer; a reference column, no target); and 8 concurrent follow-up turns on ~1,000-token
   conversations (--deep-tokens; prefilled one by one first; a reference column: answers
   decoded deep in the KV cache, as in a conversation's later turns). The servers take
   turns part by part (who goes first alternates), so that a slow minute on this shared
   machine lands on both, and before each part both sit idle until neither uses CPU nor
   writes, and the kernel has written out what they wrote; one untimed round of every
   part on both servers goes first (--warmup: a fresh process's first requests are slow
   here);
4. prints each run (with chunks per token of the 1- and 8-stream parts: one a token is
   what OpenAI and llama-server send), then the median over pairs of chatbox / llama-server;
5. prints the resident memory (VmRSS) of both servers at ready and after the load, and
   chatbox's own breakdown of it (`chatbox doctor`'s rows) after the load.
Targets: >= 1.0x at one and at 8 streams, the follow-up TTFT no slower, and serving CPU per
token (every thread but llama.cpp's compute) within 1.5x of llama-server's at one stream and
1.3x at eight.

--as-shipped: chatbox as a team runs it: the default moderation (in and out checks) and the
shipped engine settings (no --n-parallel / --n-ctx passed to chatbox). --memory: only the
memory part (both servers' RSS at ready, one round of every part, RSS after it; no timed
pairs). --no-peer: chatbox alone (where llama-server is not built).

--straight: a box just started, as its first users meet it: llama-server starts first, then
chatbox; chatbox's parts run one after another from the moment `/readyz` says ready
(whatever its start-up left running included), then llama-server's, each after quiet. No
untimed round; one pair (run it again for another: each starts both afresh).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.load import BENCH_POLICY, free_port, make_users  # noqa: E402

CPU_FLAGS = {
    "CMAKE_BUILD_TYPE": "Release",
    "GGML_NATIVE": "OFF",
    "GGML_AVX2": "ON",
    "GGML_FMA": "ON",
    "GGML_F16C": "ON",
    "LLAMA_CURL": "OFF",  # older sources; newer ones dropped it (checked below)
    "LLAMA_OPENSSL": "OFF",  # loopback only: no TLS library needed
    "LLAMA_BUILD_TESTS": "OFF",
    "LLAMA_BUILD_EXAMPLES": "OFF",
}
TOPICS = ["rivers", "bread", "owls", "chess", "tea", "kites", "bees", "maps"]
FILLER = (
    "The committee reviewed the quarterly figures, noted a modest rise in costs, and asked "
    "for a short summary of the options before the next meeting. "
)


# -- the peer binary -----------------------------------------------------------------------


def cmake_options(source: Path) -> set[str]:
    """Option names the source's CMake files declare (so flags it dropped are not passed)."""
    names: set[str] = {"CMAKE_BUILD_TYPE"}
    for path in source.rglob("CMakeLists.txt"):
        names.update(re.findall(r"option\(\s*([A-Z0-9_]+)", path.read_text(errors="replace")))
    return names


def build_peer(cache: Path, version: str, jobs: int) -> Path:
    """llama-server built from llama-cpp-python `version`'s vendored llama.cpp (cached)."""
    root = cache / "peer" / version
    binary = root / "build" / "bin" / "llama-server"
    if binary.exists():
        return binary
    root.mkdir(parents=True, exist_ok=True)
    sdist = root / "sdist"
    if not any(sdist.glob("*.tar.gz")):
        print(f"downloading the llama-cpp-python {version} sdist ...", flush=True)
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        subprocess.run([*pip, f"llama-cpp-python=={version}", "-d", str(sdist)], check=True)
    src = root / "src"
    if not (src / "vendor" / "llama.cpp").exists():
        shutil.rmtree(src, ignore_errors=True)
        with tarfile.open(next(sdist.glob("*.tar.gz"))) as tar:
            top = tar.getnames()[0].split("/")[0]
            tar.extractall(root, filter="data")
        (root / top).rename(src)
    source = src / "vendor" / "llama.cpp"
    known = cmake_options(source)
    flags = [f"-D{k}={v}" for k, v in CPU_FLAGS.items() if k in known]
    skipped = sorted(set(CPU_FLAGS) - known)
    print(
        f"building llama-server ({' '.join(flags)}; not in this source: {skipped or 'none'})",
        flush=True,
    )
    build = root / "build"
    subprocess.run(["cmake", "-S", str(source), "-B", str(build), *flags], check=True)
    subprocess.run(
        ["cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs)], check=True
    )
    return binary


def serving_model() -> Path:
    """chatbox's serving copy of its default model (what `chatbox serve` loads on CPU)."""
    from benchmarks.engine import default_model
    from chatbox.catalog.requant import serving_path
    from chatbox.settings import settings_from_env

    return serving_path(default_model(), settings_from_env().cache_dir / "models")


# -- the servers ---------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    url: str
    key: str
    model: str
    admin: str = ""  # chatbox: an admin's API key

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wait_ready(proc: subprocess.Popen[bytes], url: str, path: str, log: Path) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"the server exited while starting; see {log}")
        time.sleep(0.3)
    proc.kill()
    raise SystemExit(f"the server did not become ready; see {log}")


def start_chatbox(args: argparse.Namespace, work: Path) -> Server:
    data = work / "chatbox-data"
    ((_, key),) = make_users(data, 1, 1.0)  # one paid user
    policy = work / "policy.toml"  # no per-user stream cap, nobody shed
    text = BENCH_POLICY.format(model="smollm2", high_water=256)
    if not (args.moderation or args.as_shipped):  # llama-server moderates nothing
        text += "\n[moderation]\nenabled = false\n"
    policy.write_text(text)
    port = free_port()
    cmd = [sys.executable, "-m", "chatbox", "--data-dir", str(data), "serve"]
    cmd += ["--port", str(port), "--model", "smollm2", "--policy", str(policy)]
    if not args.as_shipped:
        cmd += ["--n-parallel", str(args.slots), "--n-ctx", str(args.n_ctx)]
    cmd += ["--log-level", "warning"]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    cmd += args.chatbox_arg
    log = work / "chatbox.log"
    env = {**os.environ, "CHATBOX_ADMIN_PASSWORD": "peer-benchmark-admin"}
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, "/readyz", log)
    admin = admin_key(data)
    return Server("chatbox", proc, url, key, "smollm2", admin)


ADMIN_KEY = ("keys", "create", "--user", "admin")


def admin_key(data: Path) -> str:
    """An API key for chatbox's admin (for its memory breakdown)."""
    done = subprocess.run(
        [sys.executable, "-m", "chatbox", "--data-dir", str(data), *ADMIN_KEY],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]


def rss_mb(server: Server) -> float:
    """The server process's resident memory (VmRSS), MB."""
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def breakdown(server: Server) -> list[tuple[str, float]]:
    """chatbox's rows of where its RSS goes (GET /v1/admin/memory), MB, largest first."""
    resp = httpx.get(
        server.url + "/v1/admin/memory",
        headers={"Authorization": f"Bearer {server.admin}"},
        timeout=60,
    )
    resp.raise_for_status()
    return [(r["what"], r["bytes"] / 2**20) for r in resp.json()["rows"]]


def settle_memory(servers: list[Server], seconds: float = 30.0) -> None:
    """Wait until neither server's RSS moved by more than 1 MB for 3 s (work that follows
    readiness, e.g. chatbox loading its encoders), at most `seconds`."""
    deadline = time.monotonic() + seconds
    last = [rss_mb(s) for s in servers]
    while time.monotonic() < deadline:
        time.sleep(3)
        now = [rss_mb(s) for s in servers]
        if all(abs(a - b) < 1 for a, b in zip(now, last, strict=True)):
            return
        last = now


def start_peer(args: argparse.Namespace, binary: Path, model: Path, work: Path) -> Server:
    port = free_port()
    threads = str(args.threads or os.cpu_count() or 1)
    cmd = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["-np", str(args.slots), "-c", str(args.n_ctx), "-t", threads, "-tb", threads]
    cmd += args.peer_arg
    log = work / "llama-server.log"
    proc = subprocess.Popen(
        cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, "/health", log)
    return Server("llama-server", proc, url, "none", "smollm2")


# -- the load ------------------------------------------------------------------------------


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU time (ms) of each of a process's threads, from /proc (empty where there is none)."""
    tick = 1000 / os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        out[task.name] = (int(fields[11]) + int(fields[12])) * tick
    return out


def serving_cpu(before: dict[str, float], after: dict[str, float], compute: int) -> float:
    """CPU (ms) of every thread but the `compute` busiest (llama.cpp's compute threads, which
    spin for the whole load): the HTTP, event-loop and bookkeeping work around the model."""
    used = sorted((after[t] - before.get(t, 0.0) for t in after), reverse=True)
    return sum(used[compute:])


def written(pid: int) -> int:
    """Bytes the process has written (write calls, to files or sockets), from /proc."""
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("wchar:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def unwritten() -> int:
    """Bytes of file data the kernel has yet to write out (Dirty + Writeback, /proc/meminfo)."""
    total = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(("Dirty:", "Writeback:")):
                total += int(line.split()[1]) * 1024
    except OSError:
        pass
    return total


def settle(
    servers: list[Server], quiet_ms: float = 20.0, quiet_bytes: int = 1 << 20, most_s: float = 60.0
) -> None:
    """Wait until no server uses more than quiet_ms of CPU or writes more than quiet_bytes
    in half a second, and the kernel has written out what they wrote: what one did after
    its run (chatbox decodes the next turn's markers 0.5 s after the last answer, parks
    idle conversations ahead after 1 s and writes them to disk while idle; a disk write
    waits on fsync using little CPU, and the kernel's writeback is no process's) must not
    land in the other's run."""
    deadline = time.monotonic() + most_s
    while time.monotonic() < deadline:
        if unwritten() > 8 * quiet_bytes:
            time.sleep(0.1)
            continue
        before = [(sum(thread_cpu(s.proc.pid).values()), written(s.proc.pid)) for s in servers]
        time.sleep(0.5)
        after = [(sum(thread_cpu(s.proc.pid).values()), written(s.proc.pid)) for s in servers]
        if all(
            b[0] - a[0] <= quiet_ms and b[1] - a[1] <= quiet_bytes
            for a, b in zip(before, after, strict=True)
        ):
            return


async def stream(
    client: Any, model: str, messages: list[dict[str, str]], max_tokens: int
) -> dict[str, Any]:
    """One streamed completion: TTFT (first content), completion tokens, the answer text,
    and how many chunks carried content (one a token, as OpenAI and llama-server send)."""
    t0 = time.perf_counter()
    ttft: float | None = None
    parts: list[str] = []
    usage: Any = None
    response = await client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in response:
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            if ttft is None:
                ttft = time.perf_counter() - t0
            parts.append(chunk.choices[0].delta.content)
    details = getattr(usage, "prompt_tokens_details", None) if usage else None
    return {
        "ttft": ttft if ttft is not None else float("nan"),
        "tokens": usage.completion_tokens if usage else len(parts),
        "prompt_tokens": usage.prompt_tokens if usage else 0,
        "cached_tokens": getattr(details, "cached_tokens", None) or 0,
        "text": "".join(parts),
        "chunks": len(parts),
        "wall": time.perf_counter() - t0,
    }


def ask(nonce: str, i: int) -> list[dict[str, str]]:
    topic = TOPICS[i % len(TOPICS)]
    return [{"role": "user", "content": f"[{nonce}-{i}] Write a long story about {topic}."}]


def history(nonce: str, n_tokens: int) -> list[dict[str, str]]:
    """A conversation of about n_tokens (4 characters a token, as SmolLM2 does for English)."""
    msgs = [{"role": "system", "content": f"[{nonce}] You are a concise assistant."}]
    i = 0
    while sum(len(m["content"]) for m in msgs) < n_tokens * 4.2:
        msgs.append({"role": "user", "content": f"Point {i}: " + FILLER * 2})
        msgs.append({"role": "assistant", "content": f"Noted point {i}. " + FILLER})
        i += 1
    msgs.append({"role": "user", "content": "Summarise the points in one sentence."})
    return msgs


def openai_client(server: Server) -> Any:
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    # A new connection for every request, to both servers: llama-server's HTTP library
    # closes a kept-alive connection while the client may be sending the next request on
    # it ("Server disconnected without sending a response"), which ended runs early.
    openai_http: Any
    try:  # the HTTP library the openai client is built on (httpx2 since openai 3)
        import httpx2 as openai_http
    except ImportError:
        openai_http = httpx
    limits = openai_http.Limits(max_keepalive_connections=0)
    return AsyncOpenAI(
        base_url=server.url + "/v1",
        api_key=server.key,
        timeout=600.0,
        max_retries=0,
        http_client=DefaultAsyncHttpxClient(limits=limits),
    )


PHASES = ("serial", "concurrent", "history", "deep")


def encoder_cpu_s(server: Server) -> float | None:
    """CPU seconds chatbox's sentence encoder has spent (moderation's checks under this
    load), from its /metrics; None for llama-server."""
    if not server.admin:
        return None
    r = httpx.get(
        server.url + "/metrics", headers={"Authorization": f"Bearer {server.admin}"}, timeout=30
    )
    r.raise_for_status()
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        sample.value
        for family in text_string_to_metric_families(r.text)
        if family.name == "chatbox_encoder_cpu_seconds"
        for sample in family.samples
    )


async def run_phase(server: Server, args: argparse.Namespace, phase: str) -> dict[str, Any]:
    """One part of the load against one server: one stream, 8 streams, or the history's
    cold, follow-up and paused turns."""
    client = openai_client(server)
    nonce = uuid.uuid4().hex[:8]  # fresh prompts: nothing cached from an earlier run
    compute = args.threads or os.cpu_count() or 1
    n, mt = args.slots, args.max_tokens
    try:
        await stream(client, server.model, ask(nonce, 99), 8)  # warm-up
        if phase in ("serial", "concurrent"):
            enc0 = encoder_cpu_s(server)
            cpu0, t0 = thread_cpu(server.proc.pid), time.perf_counter()
            if phase == "serial":
                done = [await stream(client, server.model, ask(nonce, i), mt) for i in range(n)]
            else:
                done = await asyncio.gather(
                    *(stream(client, server.model, ask(nonce, n + i), mt) for i in range(n))
                )
            wall, cpu1 = time.perf_counter() - t0, thread_cpu(server.proc.pid)
            enc1 = encoder_cpu_s(server)
            tokens = sum(r["tokens"] for r in done)
            out = {
                f"{phase}_tok_s": tokens / wall,
                f"{phase}_tokens_per_answer": statistics.mean(r["tokens"] for r in done),
                f"{phase}_serving_ms": serving_cpu(cpu0, cpu1, compute) / tokens,
                f"{phase}_chunks_per_token": sum(r["chunks"] for r in done) / max(tokens, 1),
            }
            if enc0 is not None and enc1 is not None:  # chatbox: its encoder's share
                out[f"{phase}_encoder_core"] = (enc1 - enc0) / wall
                out[f"{phase}_encoder_ms"] = (enc1 - enc0) * 1000 / tokens
            return out
        if phase == "deep":  # 8 people mid-conversation: answers decode deep in their KV
            turns = [history(f"{nonce}-d{i}", args.deep_tokens) for i in range(n)]
            firsts = [await stream(client, server.model, t, 1) for t in turns]  # prefill
            follow = [
                [
                    *t,
                    {"role": "assistant", "content": f["text"]},
                    {"role": "user", "content": f"Tell me more about point {i}."},
                ]
                for i, (t, f) in enumerate(zip(turns, firsts, strict=True))
            ]
            t0 = time.perf_counter()
            done = await asyncio.gather(*(stream(client, server.model, f, mt) for f in follow))
            wall = time.perf_counter() - t0
            return {"deep_tok_s": sum(r["tokens"] for r in done) / wall}
        colds, follows, paused, cached = [], [], [], []
        for rep in range(args.ttft_reps):
            turn1 = history(f"{nonce}-h{rep}", args.history_tokens)
            first = await stream(client, server.model, turn1, 16)
            turn2 = [
                *turn1,
                {"role": "assistant", "content": first["text"]},
                {"role": "user", "content": "Thanks. Shorter, please?"},
            ]
            second = await stream(client, server.model, turn2, 16)
            await asyncio.sleep(args.pause)  # a person reads the answer, then asks again
            turn3 = [
                *turn2,
                {"role": "assistant", "content": second["text"]},
                {"role": "user", "content": "And which point matters most?"},
            ]
            third = await stream(client, server.model, turn3, 16)
            colds.append(first["ttft"])
            follows.append(second["ttft"])
            paused.append(third["ttft"])
            cached.append((second["prompt_tokens"], second["cached_tokens"]))
    finally:
        await client.close()
    return {
        "cold_ttft": statistics.median(colds),
        "followup_ttft": statistics.median(follows),
        "paused_ttft": statistics.median(paused),
        "followup_prompt_cached": cached[-1],
    }


COLUMNS = [
    ("serial_tok_s", "1 stream tok/s", "{:.1f}"),
    ("concurrent_tok_s", "8 streams tok/s", "{:.1f}"),
    ("deep_tok_s", "8 streams deep tok/s", "{:.1f}"),
    ("cold_ttft", "cold TTFT s", "{:.3f}"),
    ("followup_ttft", "follow-up TTFT s", "{:.3f}"),
    ("paused_ttft", "follow-up after a pause TTFT s", "{:.3f}"),
    ("serial_serving_ms", "1 stream serving CPU ms/token", "{:.3f}"),
    ("concurrent_serving_ms", "8 streams serving CPU ms/token", "{:.3f}"),
    ("serial_chunks_per_token", "1 stream chunks/token", "{:.2f}"),
    ("concurrent_chunks_per_token", "8 streams chunks/token", "{:.2f}"),
]
# reference columns: no target
# CPU per token outside llama.cpp's compute: lower is better, within these of llama-server's
CPU_TARGETS = {"serial_serving_ms": "<= 1.5x", "concurrent_serving_ms": "<= 1.3x"}
REFERENCE = {
    "deep_tok_s",
    "cold_ttft",
    "paused_ttft",
    "serial_chunks_per_token",
    "concurrent_chunks_per_token",
}


def report(
    runs: list[dict[str, Any]], pairs: list[tuple[dict[str, Any], dict[str, Any]]]
) -> dict[str, Any]:
    head = " | ".join(c[1] for c in COLUMNS)
    print(f"\n| run | server | {head} | follow-up cached/prompt |")
    print("|---|---|" + "---|" * (len(COLUMNS) + 1))
    for r in runs:
        cells = " | ".join(fmt.format(r[k]) for k, _, fmt in COLUMNS)
        p, c = r["followup_prompt_cached"]
        print(f"| {r['pair']} | {r['server']} | {cells} | {c}/{p} |")
    encoder = [r for r in runs if "serial_encoder_core" in r]
    if encoder:  # moderation's share of serving (its encoder's CPU), chatbox only
        print("\n| run | encoder, 1 stream: share of a core, ms/token | 8 streams |")
        print("|---|---|---|")
        for r in encoder:
            shares = [
                f"{100 * r[f'{ph}_encoder_core']:.1f}%, {r[f'{ph}_encoder_ms']:.3f} ms"
                for ph in ("serial", "concurrent")
            ]
            print(f"| {r['pair']} | {shares[0]} | {shares[1]} |")
    ratios: dict[str, Any] = {}
    print("\n| chatbox / llama-server (median of pairs) | ratio | pairs | target |")
    print("|---|---|---|---|")
    for key, label, _ in COLUMNS:
        values = [ours[key] / theirs[key] for ours, theirs in pairs]
        med = statistics.median(values)
        # TTFT: lower is better, so the target is a ratio <= 1.0
        target = CPU_TARGETS.get(key) or ("<= 1.0x" if "ttft" in key else ">= 1.0x")
        ratios[key] = {"median": med, "pairs": values}
        spread = ", ".join(f"{v:.2f}" for v in values)
        goal = target if key not in REFERENCE else "(reference)"
        print(f"| {label} | {med:.2f}x | {spread} | {goal} |")
    return ratios


def run_phase_retrying(
    server: Server,
    args: argparse.Namespace,
    phase: str,
    binary: Path,
    model: Path,
    work: Path,
    servers: list[Server],
) -> dict[str, Any] | None:
    """run_phase; a llama-server that fails is started afresh and tried once more (a failed
    part is not counted). None: no result."""
    try:
        return asyncio.run(run_phase(server, args, phase))
    except Exception as exc:
        print(f"{server.name} failed ({phase}): {exc!r}", flush=True)
        if server.name != "llama-server":
            return None
    print("restarting llama-server", flush=True)
    server.stop()
    servers[1] = start_peer(args, binary, model, work)
    try:
        return asyncio.run(run_phase(servers[1], args, phase))
    except Exception as again:
        print(f"llama-server failed again ({phase}): {again!r}", flush=True)
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--pairs", type=int, default=3, help="interleaved pairs of runs")
    ap.add_argument(
        "--warmup", type=int, default=1, help="untimed rounds of every part on both servers"
    )
    ap.add_argument(
        "--threads", type=int, default=0, help="both (0: chatbox's default, llama-server all cores)"
    )
    ap.add_argument("--slots", type=int, default=8, help="-np / --n-parallel")
    ap.add_argument("--n-ctx", type=int, default=16384, help="-c / --n-ctx")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per answer")
    ap.add_argument("--history-tokens", type=int, default=1800)
    ap.add_argument(
        "--deep-tokens", type=int, default=1000, help="history of each deep stream (reference)"
    )
    ap.add_argument("--ttft-reps", type=int, default=2, help="history conversations per run")
    ap.add_argument(
        "--pause", type=float, default=2.0, help="seconds before the third turn (a person reading)"
    )
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="build jobs")
    ap.add_argument("--chatbox-arg", action="append", default=[], help="extra `serve` flag")
    ap.add_argument("--peer-arg", action="append", default=[], help="extra llama-server flag")
    ap.add_argument(
        "--moderation", action="store_true", help="keep chatbox's default moderation on"
    )
    ap.add_argument(
        "--as-shipped",
        action="store_true",
        help="chatbox's default moderation and shipped engine settings",
    )
    ap.add_argument("--memory", action="store_true", help="only RSS at ready and after a round")
    ap.add_argument(
        "--straight", action="store_true", help="chatbox's parts straight after ready, one pair"
    )
    ap.add_argument("--no-peer", action="store_true", help="chatbox alone")
    ap.add_argument("--only-build", action="store_true", help="build the peer and stop")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "peer.json"))
    args = ap.parse_args(argv)
    from chatbox.settings import settings_from_env

    version = importlib.metadata.version("llama-cpp-python")
    binary = Path("/nonexistent")
    if not args.no_peer:
        built = build_peer(settings_from_env().cache_dir, version, args.jobs)
        # A copy under another name: stopping it never touches another llama-server.
        binary = built.with_name("cpp-peer")
        if not binary.exists() or binary.stat().st_mtime < built.stat().st_mtime:
            shutil.copy2(built, binary)
        print(f"llama-server: {binary}")
    if args.only_build:
        return 0
    model = serving_model()
    print(f"model: {model}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="chatbox-peer-"))
    if args.straight:  # chatbox last, so that its first part meets it just ready
        args.warmup, args.pairs = 0, 1
        peer_server = None if args.no_peer else start_peer(args, binary, model, work)
        servers = [start_chatbox(args, work)] + ([peer_server] if peer_server else [])
    else:
        servers = [start_chatbox(args, work)]
        if not args.no_peer:
            servers.append(start_peer(args, binary, model, work))
    if args.memory:
        return memory_only(args, servers, binary, model, work)
    runs: list[dict[str, Any]] = []
    pairs: list[tuple[dict[str, Any], dict[str, Any]]] = []
    try:
        # Untimed first: a fresh process's first requests can be ten times slower than the
        # next ones, which would decide a pair on its own.
        for _ in range(args.warmup):
            for phase in PHASES:
                for server in list(servers):
                    settle(servers)
                    run_phase_retrying(server, args, phase, binary, model, work, servers)
        for k in range(args.pairs):
            got: dict[str, dict[str, Any]] = {"chatbox": {}, "llama-server": {}}
            if args.straight:  # every part of chatbox's first, none waiting for quiet
                turns = [(phase, server) for server in list(servers) for phase in PHASES]
            else:  # part by part, who goes first alternating
                turns = [
                    (phase, server)
                    for i, phase in enumerate(PHASES)
                    for server in (servers if (k + i) % 2 == 0 else servers[::-1])
                ]
            for phase, server in turns:
                if not (args.straight and server.name == "chatbox"):
                    settle(servers)
                result = run_phase_retrying(server, args, phase, binary, model, work, servers)
                if result is None:
                    break
                got[server.name].update(result)
            needed = [key for key, _, _ in COLUMNS] + ["followup_prompt_cached"]
            if not all(key in r for r in got.values() for key in needed):
                print(f"pair {k + 1} is incomplete: stopping", flush=True)
                break
            for name in ("chatbox", "llama-server"):
                got[name].update(pair=k + 1, server=name)
                runs.append(got[name])
                print(
                    f"pair {k + 1} {name}: "
                    + ", ".join(f"{lbl} {fmt.format(got[name][key])}" for key, lbl, fmt in COLUMNS),
                    flush=True,
                )
            pairs.append((got["chatbox"], got["llama-server"]))
    finally:
        for server in servers:
            server.stop()
    if not pairs:
        raise SystemExit("no pair of runs completed")
    ratios = report(runs, pairs)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"version": version, "model": str(model), "args": vars(args), "runs": runs}
    out.write_text(json.dumps({**result, "ratios": ratios}, indent=2))
    print(f"wrote {out} (server logs in {work})")
    return 0


def memory_only(
    args: argparse.Namespace, servers: list[Server], binary: Path, model: Path, work: Path
) -> int:
    """RSS of each server at ready and after one round of every part; chatbox's rows."""
    try:
        settle_memory(servers)
        ready = {s.name: rss_mb(s) for s in servers}
        at_ready = breakdown(servers[0])
        for phase in PHASES:
            for server in list(servers):
                settle(servers)
                run_phase_retrying(server, args, phase, binary, model, work, servers)
        after = {s.name: rss_mb(s) for s in servers}
        rows = breakdown(servers[0])
    finally:
        for server in servers:
            server.stop()
    print("\n| server | RSS at ready MB | RSS after the load MB |")
    print("|---|---|---|")
    for name in ready:
        print(f"| {name} | {ready[name]:,.0f} | {after[name]:,.0f} |")
    print("\n| chatbox: where RSS goes | at ready MB | after the load MB |")
    print("|---|---|---|")
    before = dict(at_ready)
    for what, mb in rows:
        print(f"| {what} | {before.get(what, 0.0):,.1f} | {mb:,.1f} |")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"args": vars(args), "rss_ready_mb": ready, "rss_after_mb": after}
    out.write_text(json.dumps({**result, "breakdown_after_mb": dict(rows)}, indent=2))
    print(f"wrote {out} (server logs in {work})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
