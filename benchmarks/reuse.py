"""Does a follow-up sent the moment its answer ends reuse the whole previous prompt?

    python benchmarks/reuse.py [--conversations 10] [--load 0,14] [--json OUT]

For each setup, one box (`chatbox serve` as shipped: default settings, policy and
moderation) and router mode (a `chatbox serve --no-local` front before two
`chatbox replica` processes on the default model), each with no other traffic and with
`--load` other people's conversations asking turn after turn beside it (more than the
engine's slots, so conversations are parked and restored), and each through the
conversation API and the OpenAI API: `--conversations` conversations, one after another,
each asking a first turn and, as soon as its answer is whole, a follow-up. A follow-up
reuses the whole previous prompt when its cached tokens are at least the first turn's
prompt tokens. Target: every follow-up, in every row.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.replicas import wait_healthy  # noqa: E402
from tests.served import CHATBOX, Served, free_port  # noqa: E402
from tests.sse import parse_sse  # noqa: E402

TOKEN = "bench-reuse-token"
Headers = dict[str, str]


class Refused(Exception):
    """The server answered a turn with an error status (a shed turn: 503)."""


def turn(url: str, headers: Headers, conv: str, text: str, max_tokens: int) -> dict[str, Any]:
    """One conversation-API turn over SSE: its final event's data."""
    body = {"content": text, "max_tokens": max_tokens}
    with httpx.stream(
        "POST", f"{url}/v1/conversations/{conv}/turns", json=body, headers=headers, timeout=300
    ) as resp:
        if resp.status_code != 200:
            raise Refused(f"{resp.status_code} {resp.read().decode()}")
        for event in parse_sse(resp.iter_lines()):
            if event.event in ("done", "error"):
                return {"kind": event.event, **event.json()}
    raise AssertionError("the turn ended without a final event")


def completion(url: str, headers: Headers, messages: list[dict[str, str]]) -> dict[str, Any]:
    body = {"messages": messages, "max_tokens": 64}
    resp = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=300)
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()
    return out


def conversation(url: str, headers: Headers) -> str:
    resp = httpx.post(f"{url}/v1/conversations", json={}, headers=headers, timeout=60)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


def follow_up(url: str, headers: Headers, i: int, api: str) -> tuple[int, int]:
    """One conversation's first turn and its immediate follow-up: (the first turn's prompt
    tokens, the follow-up's cached tokens)."""
    first = f"Conversation {i}: what is a good name for a cat? Give three."
    if api == "conversations":
        conv = conversation(url, headers)
        a = turn(url, headers, conv, first, 64)
        b = turn(url, headers, conv, "And for a dog?", 64)
        return int(a["usage"]["prompt_tokens"]), int(b["usage"]["cached_tokens"])
    messages = [{"role": "user", "content": first}]
    a = completion(url, headers, messages)
    answer = a["choices"][0]["message"]["content"]
    messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Why?"}]
    b = completion(url, headers, messages)
    cached = (b["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return int(a["usage"]["prompt_tokens"]), int(cached)


@contextmanager
def traffic(url: str, keys: list[Headers]) -> Iterator[None]:
    """Each key's person asking turn after turn in a conversation of their own (a turn the
    server sheds is asked again a second later)."""
    stop = threading.Event()

    def one(i: int, headers: Headers) -> None:
        conv, k = conversation(url, headers), 0
        while not stop.is_set():
            try:
                turn(url, headers, conv, f"Question {i}.{k}: tell me about rivers.", 96)
            except Refused:  # shed (free users beyond the high-water mark): again
                stop.wait(1.0)
            except httpx.HTTPError:
                if not stop.is_set():
                    raise
            k += 1

    threads = [threading.Thread(target=one, args=(i, h), daemon=True) for i, h in enumerate(keys)]
    for t in threads:
        t.start()
    time.sleep(3)  # every conversation under way
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=300)


def start_replica(data: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHATBOX_")}
    args = [CHATBOX, "--data-dir", str(data), "replica", "--port", str(port)]
    args += ["--model", "smollm2", "--token", TOKEN]
    log = (data.parent / f"replica-{port}.log").open("wb")
    proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(proc, url, TOKEN, timeout_s=300)  # its log: replica-PORT.log beside its data
    return proc, url


@contextmanager
def box(setup: str) -> Iterator[Served]:
    """`chatbox serve` as shipped, alone or as a front before two replicas."""
    where = Path(tempfile.mkdtemp(prefix=f"reuse-{setup}-"))
    procs: list[subprocess.Popen[bytes]] = []
    args: tuple[str, ...] = ()
    env: dict[str, str] = {}
    if setup == "router":
        for i in range(2):
            (where / f"replica{i}").mkdir()
            proc, url = start_replica(where / f"replica{i}" / "data")
            procs.append(proc)
            args += ("--replica", url)
        args += ("--no-local",)
        env["CHATBOX_REPLICA_TOKEN"] = TOKEN
    served = Served(where, policy=None, small=False, args=args, env=env).start()
    try:
        yield served
    finally:
        served.stop()
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=60)


def measure(served: Served, n: int, load: int, api: str) -> list[tuple[int, int]]:
    keys = [served.auth(served.user(f"reuse-load-{api}-{i}")) for i in range(load)]
    asker = served.auth(served.user(f"reuse-{api}-{load}", tier="paid"))
    with traffic(served.url, keys):
        return [follow_up(served.url, asker, i, api) for i in range(n)]


def line(r: dict[str, Any]) -> str:
    return (
        f"| {r['setup']} | {r['load']} | {r['api']} | {r['reused']} of {r['of']} "
        f"| {r['prompt']} | {r['cached_min']}-{r['cached_max']} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--conversations", type=int, default=10)
    ap.add_argument("--load", default="0,14", help="other conversations beside, per row")
    ap.add_argument("--setups", default="one box,router")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "reuse.json")
    args = ap.parse_args()
    loads = [int(x) for x in args.load.split(",")]
    rows: list[dict[str, Any]] = []
    print(
        "| setup | other conversations | API | whole previous prompt reused | "
        "first prompt tokens | follow-up cached tokens |"
    )
    print("|---|---|---|---|---|---|")
    for setup in args.setups.split(","):
        with box(setup) as served:
            for load in loads:
                for api in ("conversations", "openai"):
                    got = measure(served, args.conversations, load, api)
                    row = {
                        "setup": setup,
                        "load": load,
                        "api": api,
                        "reused": sum(cached >= prompt for prompt, cached in got),
                        "of": len(got),
                        "prompt": max(prompt for prompt, _ in got),
                        "cached_min": min(cached for _, cached in got),
                        "cached_max": max(cached for _, cached in got),
                        "pairs": got,
                    }
                    rows.append(row)
                    print(line(row), flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
