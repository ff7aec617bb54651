"""Moderation benchmark: input-check latency, output moderation's cost to streaming, and the
category classifier's precision/recall on the held-out set.

    python benchmarks/moderation.py [--model smollm2] [--streams 8] [--tokens 128]
        [--checks 300] [--samples 40] [--ttft-only] [--accuracy] [--quick] [--json OUT]

1. precision and recall per category on chatbox/moderation/data/heldout.tsv (never trained on),
   at the shipped policy's thresholds (targets: precision >= 0.9, recall >= 0.8 on blocking
   categories), and the share of the everyday requests of chatbox/moderation/data/benign.tsv
   (never trained on) that a message's check flags or blocks (target: <= 1% flagged).
   `--accuracy` runs just this part, without a chat model;
2. input check latency (rules + profanity + categories, one message at a time) p50/p99, idle
   and while `--streams` answers decode on the real model (target: p99 < 20 ms);
3. TTFT and tokens/s of `--streams` concurrent answers with output moderation on vs off
   (target: TTFT unchanged within noise, throughput >= 95%);
4. the TTFT input moderation adds, in interleaved on/off pairs, for (a) an OpenAI
   follow-up: a ~1,800-token history sent again with one new message, (b) a new
   ~2,000-token message, new to the moderator each time though its prompt is cached in KV
   (its prefill's seconds would bury the difference in noise): the p50 and p99 of TTFT on
   and off, the p99 TTFT added (p99 on - p99 off; target: < 50 ms whatever the history's
   length), and the p50 and p99 of the pairs' differences (a pair's difference also holds
   both calls' own noise: a slow prefill on either side counts whole).
   `--ttft-only` runs just this part.
The app runs in-process (Services), answering through the OpenAI-API path (`chat.complete`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from chatbox.chat import ChatMessage, TokenEvent, TurnOptions  # noqa: E402
from chatbox.chat.policy import default_policy_path  # noqa: E402
from chatbox.knowledge.embedder import Embedder  # noqa: E402
from chatbox.moderation.checker import Moderator  # noqa: E402
from chatbox.moderation.classifier import HELDOUT, read_labelled  # noqa: E402
from chatbox.moderation.evaluate import benign, evaluate  # noqa: E402
from chatbox.moderation.policy import ModerationPolicy  # noqa: E402
from chatbox.services.server import Services  # noqa: E402
from chatbox.settings import EngineSettings, Settings  # noqa: E402
from chatbox.store import User  # noqa: E402

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a refrigerator works, step by step.",
    "Describe a walk through a forest in autumn.",
    "Give me ten tips for learning a new language.",
    "Tell me about the history of bicycles.",
    "Write a letter to a friend about a trip to the sea.",
    "Explain photosynthesis in detail.",
    "Describe how bread is made from wheat to loaf.",
]


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


async def start(data_dir: Path, model: str, streams: int, runtime: str = "onnx") -> Services:
    """An app on `model` with the shipped moderation policy (output on; the runs flip it)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    policy = data_dir / "policy.toml"
    base = default_policy_path().read_text().replace('"gemma3-270m"', f'"{model}"')
    base = base.replace('model = "smollm2"', f'model = "{model}"')
    for limit in ("rpm = 120", "tpm = 200000", "monthly_tokens = 20000000"):  # no quota here
        base = base.replace(limit, limit.split("=")[0] + "= 0")
    base = base.replace("max_streams = 4", "max_streams = 64")
    policy.write_text(base)
    settings = Settings(
        data_dir=data_dir,
        model=model,
        admin_password="bench-admin",
        policy_path=policy,
        # room for part 4's ~2,000-token prompts in one slot
        engine=EngineSettings(n_parallel=streams, n_ctx=streams * 1024, n_ctx_per_seq=4096),
        embedding_runtime=runtime,
    )
    services = await Services.start(settings)
    await services.models.engine(model)
    assert services.moderation is not None
    await services.moderation.moderator.start()
    return services


async def stream(
    services: Services, user: User, prompt: str, tokens: int
) -> tuple[float, int, float, float]:
    """(time to first token, tokens, seconds, seconds from the last token to the end) of one
    answer."""
    options = TurnOptions(max_tokens=tokens, temperature=0.8, seed=len(prompt))
    t0 = time.perf_counter()
    _, generation, _ = await services.chat.complete((ChatMessage("user", prompt),), options, user)
    ttft, n, last = float("nan"), 0, t0
    async for event in generation:
        if isinstance(event, TokenEvent):
            last = time.perf_counter()
            if n == 0:
                ttft = last - t0
            n += 1
    end = time.perf_counter()
    return ttft, n, end - t0, end - last


def thread_cpu() -> dict[str, float]:
    """CPU seconds so far of this process's threads, by group: the event loop (the main
    thread), the embedder's lanes, and the rest (the engines' decode and worker threads)."""
    tick = os.sysconf("SC_CLK_TCK")
    named = {t.native_id: t.name for t in threading.enumerate()}
    out = {"event loop": 0.0, "embedder": 0.0, "engines and other": 0.0}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        name = named.get(int(tid), "")
        group = (
            "event loop"
            if name == "MainThread"
            else "embedder"
            if name.startswith("embedder-")
            else "engines and other"
        )
        out[group] += (int(stat[11]) + int(stat[12])) / tick
    return out


async def streams_run(services: Services, user: User, k: int, tokens: int) -> dict[str, float]:
    cpu0, t0 = thread_cpu(), time.perf_counter()
    results = await asyncio.gather(
        *(stream(services, user, PROMPTS[i % len(PROMPTS)], tokens) for i in range(k))
    )
    wall = time.perf_counter() - t0
    cpu = {f"cpu {g}": v - cpu0[g] for g, v in thread_cpu().items()}
    ttfts = [r[0] for r in results]
    return {
        "ttft_p50_ms": statistics.median(ttfts) * 1000,
        "ttft_max_ms": max(ttfts) * 1000,
        "tokens_per_s": sum(r[1] for r in results) / wall,
        "tail_ms": statistics.mean(r[3] for r in results) * 1000,
        "wall_s": wall,
        **cpu,
    }


async def check_latency(
    services: Services, user: User, n: int, during: asyncio.Task[Any] | None = None
) -> list[float]:
    """n checks, one at a time (stopping early if `during` ends: only checks made while it
    runs count)."""
    moderation = services.moderation
    assert moderation is not None
    texts = [t for _, t in read_labelled(HELDOUT)]
    out = []
    for i in range(n):
        if during is not None and during.done():
            break
        verdict = await moderation.check(user, texts[i % len(texts)] + f" ({i})", "input")
        out.append(verdict.elapsed_s * 1000)
    return out


SENTENCE = "We walked along the river past the old mill, and talked about the harvest. "


def words(n_tokens: int, salt: str) -> str:
    """About n_tokens of plain English (~4 characters a token), made unique by salt."""
    return salt + " " + SENTENCE * max(1, n_tokens * 4 // len(SENTENCE))


async def first_token(services: Services, user: User, messages: tuple[ChatMessage, ...]) -> float:
    """Seconds from the call to the first token of a short answer."""
    options = TurnOptions(max_tokens=4, temperature=0.0)
    t0 = time.perf_counter()
    _, generation, _ = await services.chat.complete(messages, options, user)
    ttft = float("nan")
    async for event in generation:
        if isinstance(event, TokenEvent) and ttft != ttft:
            ttft = time.perf_counter() - t0
    return ttft


NEW_MESSAGE = "a new ~2,000-token message"


def forget(moderator: Moderator) -> None:
    """The moderator as if it had never seen a text: no remembered verdict, no remembered
    message vector."""
    moderator.verdicts.clear()
    if moderator.embedder is not None:
        moderator.embedder.forget()


async def settled(moderator: Moderator) -> None:
    """Until no check is in flight (what a call checks beside its answer may outlast it)."""
    while moderator._running:
        await asyncio.sleep(0.01)


async def added_ttft(services: Services, user: User, samples: int) -> dict[str, Any]:
    """Input moderation's added TTFT: on minus off in interleaved pairs, each pair with a
    new message of its own (so it is really new to the verdict cache)."""
    moderation = services.moderation
    assert moderation is not None
    policy = moderation.policy
    history: list[ChatMessage] = []
    for i in range(12):  # ~1,800 tokens, as an OpenAI client sends it every call
        history.append(ChatMessage("user" if i % 2 == 0 else "assistant", words(150, f"#{i}")))
    # The conversation so far was sent before (its messages were new then): once now.
    await first_token(services, user, (*history, ChatMessage("user", "Go on.")))
    await settled(moderation.moderator)
    cases = {
        "follow-up, ~1,800-token history + 1 new message": lambda i: (
            *history,
            ChatMessage("user", f"({i}) And what did you see after the mill?"),
        ),
        # The same long message each time (its prompt cached in KV, so the prefill's seconds
        # and their noise stay out of the difference), ending in its own number (no cached
        # answer), checked as new: the moderator forgets it before each call.
        NEW_MESSAGE: lambda i: (ChatMessage("user", words(2000, "(new)") + f" ({i})"),),
    }
    moderator = moderation.moderator
    out: dict[str, Any] = {}
    for name, build in cases.items():
        on: list[float] = []
        off: list[float] = []
        # warm: shapes, the prefix in KV, and a first copy of it into another KV stream
        # (whose state memory is then kept: a fresh server faults it in once, ~135 ms)
        for warm in (-1, -2):
            await first_token(services, user, build(warm))
        for i in range(samples):
            for enabled in (True, False) if i % 2 == 0 else (False, True):
                moderation.policy = dataclasses.replace(policy, enabled=enabled)
                if name == NEW_MESSAGE:
                    forget(moderator)
                ttft = await first_token(services, user, build(i * 2 + int(enabled)))
                (on if enabled else off).append(ttft * 1000)
                await settled(moderator)  # what was checked beside it: not in the next
        moderation.policy = policy
        added = [a - b for a, b in zip(on, off, strict=True)]
        out[name] = {
            "on_p50": pct(on, 50),
            "off_p50": pct(off, 50),
            "on_p99": pct(on, 99),
            "off_p99": pct(off, 99),
            "p99_added": pct(on, 99) - pct(off, 99),
            "added_p50": pct(added, 50),
            "added_p99": pct(added, 99),
            "n": len(added),
            "added_ms": sorted(round(a, 1) for a in added),
        }
    return out


async def accuracy(moderator: Moderator) -> dict[str, Any]:
    """Held-out precision and recall, and the everyday requests flagged and blocked."""
    return {
        "heldout": await evaluate(moderator),
        # answer windows' vectors (the int8 graph where there is one)
        "heldout_windows": await evaluate(moderator, approximate=True),
        "benign": await benign(moderator),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {}
    if args.accuracy:  # the moderator alone, with the shipped policy, as `chatbox serve` has it
        policy = ModerationPolicy.load(default_policy_path())
        cache = Path.home() / ".cache" / "chatbox"
        return await accuracy(Moderator(policy, Embedder(), cache))
    with tempfile.TemporaryDirectory() as tmp:
        services = await start(Path(tmp) / "app", args.model, args.streams, args.embedding_runtime)
        user = await services.store.users.create("bench", tier="paid")
        try:
            report["added_ttft"] = await added_ttft(services, user, args.samples)
            if args.ttft_only:
                return report
            assert services.moderation is not None
            moderator = services.moderation.moderator
            report |= await accuracy(moderator)
            await check_latency(services, user, 30)  # warm up (first shapes, first calls)
            idle = await check_latency(services, user, args.checks)
            # Long answers, so that every check below is made while all streams decode.
            load = asyncio.create_task(streams_run(services, user, args.streams, args.tokens * 3))
            await asyncio.sleep(1.0)  # the streams are decoding
            busy = await check_latency(services, user, args.checks, during=load)
            await load
            report["latency_ms"] = {
                "idle": {"p50": pct(idle, 50), "p99": pct(idle, 99), "n": len(idle)},
                "decoding": {"p50": pct(busy, 50), "p99": pct(busy, 99), "n": len(busy)},
            }
            # Output moderation on vs off: interleaved pairs in the same app (the policy's
            # switch flipped between rounds; off first in odd pairs), so drift on a noisy
            # machine hits both sides alike; the ratio is the median of the pairs'.
            moderation = services.moderation
            policy = moderation.policy
            if args.stride:  # another window spacing than the shipped policy's
                policy = dataclasses.replace(policy, stride_tokens=args.stride)
            if args.no_screen:  # every answer window read whole (the int8 graph)
                moderator.screen = None
            rounds: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
            await streams_run(services, user, args.streams, args.tokens)  # warm
            embedder = moderator.embedder
            assert embedder is not None
            screened = dict(embedder.screened)
            for pair in range(args.rounds):
                for output in (True, False) if pair % 2 == 0 else (False, True):
                    moderation.policy = dataclasses.replace(policy, output=output)
                    result = await streams_run(services, user, args.streams, args.tokens)
                    rounds["on" if output else "off"].append(result)
            moderation.policy = policy
            report["screened"] = {k: v - screened[k] for k, v in embedder.screened.items()}
            report["screening"] = moderator.screening
        finally:
            await services.stop()

    def mean(rounds: list[dict[str, float]], key: str) -> float:
        return statistics.mean(r[key] for r in rounds)

    report["streams"] = {
        name: {k: mean(rounds[name], k) for k in rounds[name][0]} for name in ("on", "off")
    }
    report["pairs"] = [
        [on["tokens_per_s"], off["tokens_per_s"]]
        for on, off in zip(rounds["on"], rounds["off"], strict=True)
    ]
    report["throughput_ratio"] = statistics.median(
        on["tokens_per_s"] / off["tokens_per_s"]
        for on, off in zip(rounds["on"], rounds["off"], strict=True)
    )
    report["ttft_ratio"] = statistics.median(
        on["ttft_p50_ms"] / off["ttft_p50_ms"]
        for on, off in zip(rounds["on"], rounds["off"], strict=True)
    )
    return report


def print_added_ttft(r: dict[str, Any]) -> None:
    print("\nTTFT input moderation adds (on and off in interleaved pairs), ms")
    print(
        f"{'case':<50}{'on p50':>8}{'off p50':>9}{'on p99':>8}{'off p99':>9}{'p99 added':>11}"
        f"{'pairs: p50':>12}{'p99':>8}{'n':>4}"
    )
    for name, row in r["added_ttft"].items():
        print(
            f"{name:<50}{row['on_p50']:>8.0f}{row['off_p50']:>9.0f}{row['on_p99']:>8.0f}"
            f"{row['off_p99']:>9.0f}{row['p99_added']:>11.1f}{row['added_p50']:>12.1f}"
            f"{row['added_p99']:>8.1f}{row['n']:>4}"
        )


def print_accuracy(r: dict[str, Any]) -> None:
    b = r["benign"]
    print("\nEveryday requests (benign.tsv, never trained on), checked as messages, free tier")
    print(f"{'requests':>9}{'flagged':>9}{'%':>7}{'blocked':>9}{'%':>7}")
    print(
        f"{b['n']:>9}{b['flagged']:>9}{b['flagged_rate']:>7.1%}{b['blocked']:>9}"
        f"{b['blocked_rate']:>7.1%}"
    )
    for text, category, score in b["flagged_texts"]:
        print(f"  flagged: {category} {score:.3f}  {text}")
    print("\nHeld-out set (never trained on), shipped thresholds")
    print("(messages: exact vectors; answer windows: the int8 graph's, screened half-way)")
    print(f"{'category':<15}{'precision':>10}{'recall':>8}{'n':>5}{'windows P':>11}{'R':>6}")
    for c, row in r["heldout"].items():
        w = r["heldout_windows"][c]
        print(
            f"{c:<15}{row['precision']:>10.2f}{row['recall']:>8.2f}{int(row['support']):>5}"
            f"{w['precision']:>11.2f}{w['recall']:>6.2f}"
        )


def print_report(r: dict[str, Any], args: argparse.Namespace) -> None:
    if args.accuracy:
        print_accuracy(r)
        return
    print_added_ttft(r)
    if args.ttft_only:
        return
    print_accuracy(r)
    print("\nInput check latency, all layers (ms)")
    for name, row in r["latency_ms"].items():
        print(f"{name:<10} p50 {row['p50']:6.1f}   p99 {row['p99']:6.1f}   (n={row['n']})")
    on, off = r["streams"]["on"], r["streams"]["off"]
    print(f"\n{args.streams} concurrent streams, {args.tokens} tokens each, {args.model}")
    print(
        f"{'output moderation':<20}{'TTFT p50 ms':>12}{'TTFT max ms':>12}{'tokens/s':>10}"
        f"{'last token to end ms':>22}"
    )
    for name, row in (("off", off), ("on", on)):
        print(
            f"{name:<20}{row['ttft_p50_ms']:>12.0f}{row['ttft_max_ms']:>12.0f}"
            f"{row['tokens_per_s']:>10.1f}{row['tail_ms']:>22.0f}"
        )
    print("pairs (tokens/s on, off):", ", ".join(f"{a:.0f}/{b:.0f}" for a, b in r["pairs"]))
    cpu = [k for k in on if k.startswith("cpu ")]
    print(
        "CPU a round (s), off -> on: "
        + ", ".join(f"{k[4:]} {off[k]:.2f} -> {on[k]:.2f}" for k in cpu)
        + f"; wall {off['wall_s']:.2f} -> {on['wall_s']:.2f}"
    )
    if r["screening"]:
        done, seen = r["screened"]["finished"], sum(r["screened"].values())
        print(f"answer windows finished past the screen: {done} of {seen}")
    else:
        print("answer windows: read whole (not screened)")
    print(
        f"on/off, median of {args.rounds} interleaved pairs: throughput "
        f"{r['throughput_ratio']:.1%}, TTFT p50 {r['ttft_ratio']:.2f}x"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--checks", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=8, help="interleaved on/off pairs")
    ap.add_argument("--stride", type=int, default=0, help="output windows every N tokens")
    ap.add_argument("--no-screen", action="store_true", help="answer windows read whole")
    ap.add_argument("--embedding-runtime", choices=("onnx", "torch"), default="onnx")
    ap.add_argument("--samples", type=int, default=40, help="added-TTFT pairs per case")
    ap.add_argument("--ttft-only", action="store_true", help="only input moderation's TTFT")
    ap.add_argument("--accuracy", action="store_true", help="only precision, recall, benign")
    ap.add_argument("--quick", action="store_true", help="fewer checks, tokens and rounds")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.quick:
        args.checks, args.tokens, args.rounds, args.samples = 60, 48, 2, 6
    report = asyncio.run(run(args))
    print_report(report, args)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
