"""Parked KV through the conversation API of a real `chatbox serve`: warm, parked, restarted.

    python benchmarks/kvpark.py [--quick] [--history 1500] [--reps 3] [--json OUT]

Starts `chatbox serve` as a subprocess (the default model, default engine settings, a
temporary data dir with one API key, moderation off unless --moderation, memory extraction
pushed out of the run) and times a follow-up turn ("And then?", POST
/v1/conversations/{id}/turns) on a conversation whose first turn was a ~N-token message, by
where the conversation's KV is when the follow-up comes:

* warm: still live in the KV cache (the follow-up right after the first answer);
* parked in RAM: CHATBOX_IDLE_KV_CELLS=0, so an idle conversation's KV is parked at once;
* parked on disk: the same with CHATBOX_PARK_BYTES=0 (no RAM tier), once its file is written;
* after a restart: the warm server is stopped with SIGTERM (it parks idle conversations on
  disk) and started again on the same data dir; the warm cases' conversations take one more
  follow-up each;
* cold: parking off (idle cells 0, CHATBOX_PARK_BYTES=0, CHATBOX_PARK_DISK_BYTES=0), so the
  follow-up prefills the whole history again.

Plus an OpenAI-API follow-up (/v1/chat/completions with the same messages plus one more),
warm vs parked in RAM. Each configuration is its own server, run one after another (never
two at once), each with a short warm-up turn first. Medians of --reps; the table gives the
TTFT, its ratio to warm (of the same API) and the cached tokens the server reported.
Target: parked and after-restart TTFT <= 2x warm, and far below cold.
Results go to benchmarks/results/kvpark.json. Prompt-lookup decoding: benchmarks/lookup.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.load import BENCH_POLICY, free_port, make_users  # noqa: E402
from benchmarks.peer import wait_ready  # noqa: E402
from chatbox.engine.kv.disk import key_name  # noqa: E402

FOLLOW_UP = "And then?"
PRIME_TOKENS = 24  # the first answer (part of the history the follow-up resends)
FOLLOW_TOKENS = 2  # the follow-up only has to show its first token
TOPICS = ["rivers", "bread", "owls", "chess", "tea", "kites", "bees", "maps"]
SENTENCE = (
    "The committee reviewed the quarterly figures on {topic}, noted a modest rise in costs, "
    "and asked for a short summary of the options before the next meeting. "
)
# Every server: nothing else touches the engine during the run (memory extraction of idle
# conversations would), everything else as `chatbox serve` ships.
BASE_ENV = {"CHATBOX_MEMORY_IDLE_S": "86400", "CHATBOX_ADMIN_PASSWORD": "load-test-admin"}
RAM = {"CHATBOX_IDLE_KV_CELLS": "0"}
DISK = {**RAM, "CHATBOX_PARK_BYTES": "0"}
NO_PARKING = {**DISK, "CHATBOX_PARK_DISK_BYTES": "0"}


@dataclass
class Sample:
    ttft_s: float
    cached: int
    prompt: int


def history_text(tag: str, n_tokens: int) -> str:
    """A first message of about n_tokens (~4.3 characters a token for this English), led by
    a tag so that no two conversations share more than the chat template's prefix."""
    parts = [f"Meeting notes {tag}."]
    i = 0
    while sum(len(p) for p in parts) < n_tokens * 4.3:
        parts.append(f"Point {i}: " + SENTENCE.format(topic=TOPICS[i % len(TOPICS)]))
        i += 1
    return " ".join(parts) + "\nSummarise the points in one sentence."


# -- the server ----------------------------------------------------------------------------


class Server:
    """A `chatbox serve` subprocess on a data dir, with env overrides."""

    def __init__(self, args: argparse.Namespace, data: Path, env: dict[str, str]) -> None:
        port = free_port()
        policy = data / "policy.toml"
        if not policy.exists():
            text = BENCH_POLICY.format(model=args.model, high_water=256)
            if not args.moderation:  # its checks would add the same delay to every row
                text += "\n[moderation]\nenabled = false\n"
            policy.write_text(text)
        cmd = [sys.executable, "-m", "chatbox", "--data-dir", str(data), "serve"]
        cmd += ["--port", str(port), "--model", args.model, "--policy", str(policy)]
        cmd += ["--log-level", "warning"]
        self.log = data / "server.log"
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env={**os.environ, **BASE_ENV, **env},
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(self.proc, self.url, "/readyz", self.log)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """SIGTERM, as an admin's restart would (idle conversations are parked on disk)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Client:
    """The two APIs, timed: TTFT is the time to the first answer token (or the end)."""

    def __init__(self, url: str, key: str, model: str) -> None:
        self.model = model
        auth = {"Authorization": f"Bearer {key}"}
        self.http = httpx.Client(base_url=url, headers=auth, timeout=600.0)

    def close(self) -> None:
        self.http.close()

    def new_conversation(self) -> str:
        r = self.http.post("/v1/conversations", json={"title": "kvpark"})
        r.raise_for_status()
        return str(r.json()["id"])

    def turn(self, conv: str, text: str, max_tokens: int) -> Sample:
        """One turn of the conversation API (SSE: start, token..., done)."""
        body = {"content": text, "model": self.model, "temperature": 0.0}
        body["max_tokens"] = max_tokens
        t0 = time.perf_counter()
        first: float | None = None
        kind, usage = "", {}
        with self.http.stream("POST", f"/v1/conversations/{conv}/turns", json=body) as r:
            if r.status_code != 200:
                r.read()
                raise SystemExit(f"turn failed: {r.status_code} {r.text[:300]}")
            for line in r.iter_lines():
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: "):
                    if first is None and kind in ("token", "done"):
                        first = time.perf_counter() - t0
                    if kind == "error":
                        raise SystemExit(f"turn failed: {line[6:300]}")
                    if kind == "done":
                        usage = json.loads(line[6:])["usage"]
        end = time.perf_counter() - t0
        return Sample(first or end, usage.get("cached_tokens", 0), usage.get("prompt_tokens", 0))

    def complete(self, messages: list[dict[str, str]], max_tokens: int) -> tuple[Sample, str]:
        """One streamed /v1/chat/completions call; the sample and the answer."""
        body: dict[str, Any] = {"model": self.model, "messages": messages, "stream": True}
        body |= {"max_tokens": max_tokens, "temperature": 0.0}
        body["stream_options"] = {"include_usage": True}
        t0 = time.perf_counter()
        first: float | None = None
        parts: list[str] = []
        usage: dict[str, Any] = {}
        with self.http.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                r.read()
                raise SystemExit(f"completion failed: {r.status_code} {r.text[:300]}")
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or []:
                    if choice.get("delta", {}).get("content") or choice.get("finish_reason"):
                        first = first if first is not None else time.perf_counter() - t0
                        parts.append(choice.get("delta", {}).get("content") or "")
        end = time.perf_counter() - t0
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        return Sample(first or end, cached, usage.get("prompt_tokens", 0)), "".join(parts)


# -- the cases -----------------------------------------------------------------------------


def prime(c: Client, tag: str, n: int) -> str:
    """A conversation whose first turn is an n-token message; its id."""
    conv = c.new_conversation()
    c.turn(conv, history_text(tag, n), PRIME_TOKENS)
    return conv


def api_prime(c: Client, tag: str, n: int) -> list[dict[str, str]]:
    """An OpenAI-API exchange (n-token message, its answer): the messages to resend."""
    msgs = [{"role": "user", "content": history_text(tag, n)}]
    _, answer = c.complete(msgs, PRIME_TOKENS)
    return [*msgs, {"role": "assistant", "content": answer}]


def api_follow(c: Client, msgs: list[dict[str, str]]) -> Sample:
    return c.complete([*msgs, {"role": "user", "content": FOLLOW_UP}], FOLLOW_TOKENS)[0]


def wait_on_disk(data: Path, conv: str, timeout_s: float = 60.0) -> None:
    """Until the conversation's parked file is written (a user comes back later than that)."""
    deadline = time.monotonic() + timeout_s
    while not any((data / "kv").glob(f"*/{key_name(conv)}")):
        if time.monotonic() > deadline:
            raise SystemExit(f"{conv}'s KV never reached the disk under {data / 'kv'}")
        time.sleep(0.05)


class Run:
    """Servers, one at a time, on data dirs under one temporary directory."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.samples: dict[str, list[Sample]] = {}
        self.seq = 0

    def tag(self) -> str:
        self.seq += 1
        return f"#{self.seq}-{time.time_ns() % 10**9}"

    def add(self, case: str, sample: Sample) -> None:
        self.samples.setdefault(case, []).append(sample)

    def on(self, name: str, env: dict[str, str], body: Callable[[Client, Path], None]) -> None:
        data = self.work / name
        if not data.exists():
            data.mkdir()
            ((_, key),) = make_users(data, 1, 1.0)
            (data / "key").write_text(key)
        t0 = time.monotonic()
        server = Server(self.args, data, env)
        client = Client(server.url, (data / "key").read_text(), self.args.model)
        try:
            client.turn(client.new_conversation(), "Say hello.", 4)  # warm-up
            body(client, data)
        finally:
            client.close()
            server.stop()
        print(f"  {name}: {time.monotonic() - t0:.0f} s", flush=True)


def measure(args: argparse.Namespace, work: Path) -> dict[str, list[Sample]]:
    run, n, reps = Run(args, work), args.history, args.reps
    restart: list[str] = []

    def warm(c: Client, data: Path) -> None:
        for _ in range(reps):
            restart.append(prime(c, run.tag(), n))  # its next turn comes after the restart
            run.add("warm (live in KV)", c.turn(restart[-1], FOLLOW_UP, FOLLOW_TOKENS))
            run.add("api: warm", api_follow(c, api_prime(c, run.tag(), n)))

    def restarted(c: Client, data: Path) -> None:  # after SIGTERM, on the same data dir
        for conv in restart:
            run.add("after a restart (disk)", c.turn(conv, FOLLOW_UP, FOLLOW_TOKENS))

    def ram(c: Client, data: Path) -> None:
        for _ in range(reps):
            run.add("parked in RAM", c.turn(prime(c, run.tag(), n), FOLLOW_UP, FOLLOW_TOKENS))
            run.add("api: parked in RAM", api_follow(c, api_prime(c, run.tag(), n)))

    def disk(c: Client, data: Path) -> None:
        for _ in range(reps):
            conv = prime(c, run.tag(), n)
            wait_on_disk(data, conv)
            run.add("parked on disk", c.turn(conv, FOLLOW_UP, FOLLOW_TOKENS))

    def cold(c: Client, data: Path) -> None:
        for _ in range(reps):
            run.add("cold (parking off)", c.turn(prime(c, run.tag(), n), FOLLOW_UP, FOLLOW_TOKENS))

    run.on("warm", {}, warm)
    run.on("warm", {}, restarted)  # the same data dir: a restart
    run.on("ram", RAM, ram)
    run.on("disk", DISK, disk)
    run.on("cold", NO_PARKING, cold)
    return run.samples


ORDER = [
    "warm (live in KV)",
    "parked in RAM",
    "parked on disk",
    "after a restart (disk)",
    "cold (parking off)",
    "api: warm",
    "api: parked in RAM",
]


def report(samples: dict[str, list[Sample]], args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for case in ORDER:
        vals = samples.get(case, [])
        if not vals:
            continue
        base = samples["api: warm" if case.startswith("api") else "warm (live in KV)"]
        ttft = statistics.median(v.ttft_s for v in vals)
        warm = statistics.median(v.ttft_s for v in base)
        rows.append(
            {
                "case": case,
                "ttft_ms": round(ttft * 1000, 1),
                "x_warm": round(ttft / warm, 2),
                "cached_tokens": min(v.cached for v in vals),
                "prompt_tokens": max(v.prompt for v in vals),
                "all_ms": [round(v.ttft_s * 1000, 1) for v in vals],
            }
        )
    print(
        f"\nfollow-up TTFT through the HTTP APIs, ~{args.history}-token history, "
        f"median of {args.reps}"
    )
    print("| where the KV was | TTFT | x warm | cached / prompt tokens |\n|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['case']} | {row['ttft_ms']:.0f} ms | {row['x_warm']:.2f}x "
            f"| {row['cached_tokens']} / {row['prompt_tokens']} |"
        )
    by = {r["case"]: r for r in rows}
    parked = [r for r in rows if r["case"] not in ("warm (live in KV)", "cold (parking off)")]
    worst = max((r["x_warm"] for r in parked if r["case"] != "api: warm"), default=0.0)
    cold = by.get("cold (parking off)", {}).get("x_warm", 0.0)
    verdict = "met" if worst <= 2.0 and cold > 2 * worst else "NOT met"
    print(f"\ntarget (parked/restart <= 2x warm, far below cold): {verdict}")
    print(f"(worst parked {worst:.2f}x warm; cold {cold:.2f}x warm)")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="smollm2", help="model name (default: the default)")
    ap.add_argument("--history", type=int, default=1500, help="history tokens (about)")
    ap.add_argument("--reps", type=int, default=3, help="follow-ups per case (median)")
    ap.add_argument("--quick", action="store_true", help="one follow-up per case")
    ap.add_argument("--moderation", action="store_true", help="keep the default moderation")
    ap.add_argument("--keep", action="store_true", help="keep the data dirs and server logs")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "kvpark.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.reps = 1
    work = Path(tempfile.mkdtemp(prefix="kvpark-"))
    t0 = time.monotonic()
    print(f"servers (data and logs under {work}):", flush=True)
    try:
        rows = report(measure(args, work), args)
    except BaseException:
        print(f"failed; the servers' logs are under {work}", file=sys.stderr)
        raise
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    print(f"total {time.monotonic() - t0:.0f} s")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"history": args.history, "reps": args.reps, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
