"""A working day replayed in accelerated time against `chatbox serve` with a replay clock.

Two tiny models: `tiny` (the default, the free tier's) and `paid` (the paid tier's). Two weeks
of hourly history are written first: `paid` busy 09:00-17:00 on weekdays, `tiny` a few requests
every hour. The server then runs Monday 06:00-20:00 UTC at `--day-s` real seconds per 24 hours
(`CHATBOX_REPLAY_START`, `CHATBOX_REPLAY_SPEED`) while this script sends the day's traffic: a
daily cycle of free and paid requests, and from 14:00 to 16:00 a spike of paid requests that
fills every slot. It prints each decision with its replayed time as it sees it: the
pre-warmer's loads and unloads (`paid` unloaded in the quiet morning, loaded before its 09:00
peak, unloaded once idle after 17:00), the alerts firing during the spike and resolving
after, and the canaries' decisions: tier `beta` sends half its requests to `slow` (a deeper,
wider tiny model; rolled back on its time to first token), tier `gamma` half to `worse`. The
gamma canary's eval suite (`eval_suite` in the policy) is a regression suite: the tier model's
own greedy answers to the day's questions, as exact references; `worse` is the candidate model
(other weights of the same shape) that scores lowest on it with `chatbox eval run`. Gamma's
live answers (OpenAI API, greedy) are scored against the references as they come; the canary
must be held with a verdict naming eval_score. Results go to `--out` as JSON.

    python benchmarks/day.py [--day-s 96] [--out day.json]
"""

from __future__ import annotations

import argparse
import calendar
import json
import sqlite3
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from chatbox.chat.policy import default_policy_path  # noqa: E402
from chatbox.chat.rollout.prewarm import hour_of_week  # noqa: E402
from tests.served import Served  # noqa: E402
from tests.tinymodel import make_tiny_gguf  # noqa: E402

MONDAY = calendar.timegm((2026, 11, 30, 0, 0, 0))  # the replayed day: a Monday
H = 3600
WORSE_SEEDS = (11,)  # candidates for the canary that answers worse
MAX_TOKENS = 16  # the canaries' answers, live and in the suite
START_H, END_H = 6, 20  # the replayed part of the day
SPIKE_H = (14, 16)  # the spike: paid requests filling every slot
TIMEOUT = 120.0
# Two tiers of their own for the canaries, so the day's traffic and theirs stay apart.
TIERS = """
[tiers.beta]
rpm = 6000
tpm = 100000000
max_streams = 4
model = "tiny"
priority = 1

[tiers.gamma]
rpm = 6000
tpm = 100000000
max_streams = 4
model = "tiny"
priority = 1
"""
CANARIES = """
[[routing.canary]]
tier = "beta"
model = "slow"
percent = 50
arm = "slow-canary"

[[routing.canary]]
tier = "gamma"
model = "worse"
percent = 50
arm = "worse-canary"
eval_percent = 100
eval_suite = "golden.json"
"""
QUESTIONS = [
    "What is the capital of France?",
    "Name a primary colour.",
    "How many legs has a spider?",
    "What does a thermometer measure?",
    "Which planet is closest to the sun?",
    "What is two plus two?",
]


def policy(where: Path) -> Path:
    """The shipped policy with the paid tier on `paid` and no moderation (the models' text
    is random; moderation is not what this replays)."""
    text = default_policy_path().read_text()
    text = text.replace('model = "gemma3-270m"', 'model = "paid"')
    text = text.replace("[moderation]\n", "[moderation]\nenabled = false\n", 1)
    text = text.replace("\nenabled = true\noutput", "\noutput", 1)
    cache = text.index("[answer_cache]")  # the canaries' answers are measured, not cached
    text = text[:cache] + text[cache:].replace("enabled = true", "enabled = false", 1)
    text = text.replace("\n[overload]\n", TIERS + "\n[overload]\n", 1)
    path = where / "policy.toml"
    path.write_text(text + CANARIES)
    return path


def seed_history(db: Path) -> None:
    """Two weeks before the replayed Monday, per hour: `paid` 20 requests 09-17 on weekdays,
    `tiny` 4 every hour."""
    rows = []
    for hour in range(MONDAY // H - 14 * 24, MONDAY // H):
        day, clock = divmod(hour_of_week(hour), 24)
        rows.append(("tiny", hour, 4, 400))
        if day < 5 and 9 <= clock < 17:
            rows.append(("paid", hour, 20, 2000))
    with sqlite3.connect(db) as conn:
        conn.executemany("INSERT INTO usage_hours VALUES (?, ?, ?, ?)", rows)


def golden_suite(box: Served, where: Path) -> Path:
    """The gamma canary's suite: the tier model's greedy answers to QUESTIONS, as exact
    references (written beside the policy, which names it)."""
    cases: list[dict[str, Any]] = [
        {
            "id": f"q{i}",
            "prompt": q,
            "max_tokens": MAX_TOKENS,
            "check": {"kind": "regex", "pattern": "."},
        }
        for i, q in enumerate(QUESTIONS)
    ]
    probe = where / "probe.json"
    probe.write_text(json.dumps({"name": "probe", "cases": cases}))
    run = json.loads(box.cli("eval", "run", "tiny", "--suite", str(probe), "--json"))
    answers = {r["case_id"]: r["answer"] for r in run["results"]}
    for case in cases:
        case["check"] = {"kind": "exact", "expected": answers[case["id"]], "case_sensitive": True}
    path = where / "golden.json"
    path.write_text(json.dumps({"name": "golden", "cases": cases}))
    return path


def pick_worse(box: Served, where: Path) -> Path:
    """The candidate model that scores lowest on the golden suite, below the baseline (the
    eval suite says which candidate answers worse; the live verdict must find it too)."""
    suite = golden_suite(box, where)

    def score(name: str) -> float:
        run = json.loads(box.cli("eval", "run", name, "--suite", str(suite), "--json"))
        return float(run["score"])

    base = score("tiny")
    scored = []
    for seed in WORSE_SEEDS:
        path = make_tiny_gguf(where / f"cand{seed}.gguf", seed=seed)
        box.cli("models", "add", str(path), "--name", f"cand{seed}", "--link")
        scored.append((score(f"cand{seed}"), seed, path))
    low, seed, path = min(scored)
    shown = ", ".join(f"seed {s} {v:.2f}" for v, s, _ in scored)
    print(f"eval suite golden: baseline {base:.2f}; candidates {shown}; the canary: seed {seed}")
    if low >= base:
        print("no candidate scores below the baseline on the suite", flush=True)
    return path


def stamp(t: float) -> str:
    return time.strftime("%a %H:%M", time.gmtime(t))


class Replay:
    """The server's replayed time, read once and then followed at the replay's speed."""

    def __init__(self, box: Served, speed: float) -> None:
        view = httpx.get(box.url + "/v1/admin/prewarm", headers=box.admin, timeout=TIMEOUT)
        self.start = float(view.json()["now"])
        self.origin = time.time()
        self.speed = speed

    def now(self) -> float:
        return self.start + (time.time() - self.origin) * self.speed

    def wait_until(self, t: float) -> None:
        time.sleep(max(0.0, (t - self.now()) / self.speed))


def ask(box: Served, key: str, max_tokens: int) -> int:
    body = {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": max_tokens}
    try:
        r = httpx.post(
            box.url + "/v1/chat/completions", json=body, headers=box.auth(key), timeout=TIMEOUT
        )
    except httpx.HTTPError:
        return 0
    return r.status_code


def traffic(
    box: Served, replay: Replay, free: list[str], paid: list[str], stop: threading.Event
) -> dict[str, int]:
    """The day's requests, hour by hour of the replay; the spike from many threads at once."""
    sent: dict[str, int] = {}
    for hour in range(START_H, END_H):
        if stop.is_set():
            break
        begins = MONDAY + hour * H
        replay.wait_until(begins)
        n_paid = 3 if 9 <= hour < 17 else 0
        plan = [free[i % len(free)] for i in range(2)] + [
            paid[i % len(paid)] for i in range(n_paid)
        ]
        for i, key in enumerate(plan):
            replay.wait_until(begins + i * H / max(1, len(plan)))
            code = ask(box, key, 8)
            sent[str(code)] = sent.get(str(code), 0) + 1
        if SPIKE_H[0] <= hour < SPIKE_H[1]:
            ends = MONDAY + SPIKE_H[1] * H

            def flood(key: str, ends: float = ends) -> None:
                while replay.now() < ends and not stop.is_set():
                    code = ask(box, key, 160)
                    sent["spike " + str(code)] = sent.get("spike " + str(code), 0) + 1

            with ThreadPoolExecutor(16) as pool:
                list(pool.map(flood, [paid[i % len(paid)] for i in range(16)]))
    return sent


def canary_phase(
    box: Served, replay: Replay, beta: list[str], gamma: list[str], stop: threading.Event
) -> dict[str, Any]:
    """The canaries' traffic (greedy answers to the suite's questions on the OpenAI API, half
    of each tier's to its canary) until both canaries are decided or the day ends; the
    decisions are `watch`'s."""
    sent = {"beta": 0, "gamma": 0}
    states: dict[str, str] = {}
    verdicts: dict[str, str | None] = {}

    def one(tier: str, key: str, i: int) -> None:
        body = {
            "messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0.0,
            "seed": 0,
        }
        try:
            httpx.post(
                box.url + "/v1/chat/completions", json=body, headers=box.auth(key), timeout=TIMEOUT
            )
        except httpx.HTTPError:
            return
        sent[tier] += 1

    i = 0
    while not stop.is_set() and replay.now() < MONDAY + END_H * H:
        found = httpx.get(box.url + "/console/data/canaries", headers=box.admin, timeout=TIMEOUT)
        states = {c["arm"]: c["state"] for c in found.json()["canaries"]}
        verdicts = {c["arm"]: (c["verdict"] or {}).get("reason") for c in found.json()["canaries"]}
        decided = [arm for arm, state in states.items() if state != "running"]
        if len(decided) == 2:
            break
        with ThreadPoolExecutor(4) as pool:
            jobs = [
                pool.submit(one, "beta", beta[i % len(beta)], i),
                pool.submit(one, "gamma", gamma[i % len(gamma)], i),
                pool.submit(one, "beta", beta[(i + 1) % len(beta)], i + 1),
                pool.submit(one, "gamma", gamma[(i + 1) % len(gamma)], i + 1),
            ]
            for job in jobs:
                job.result()
        i += 2
    final = httpx.get(box.url + "/console/data/canaries", headers=box.admin, timeout=TIMEOUT)
    for c in final.json()["canaries"]:
        v = c["verdict"] or {}
        scores = {m["metric"]: m for m in v.get("metrics", [])}.get("eval_score")
        scored = ""
        if scores:
            scored = (
                f"; eval_score canary {scores['arm']['mean']:.2f} ({scores['arm']['n']} scored)"
                f" vs baseline {scores['baseline']['mean']:.2f} ({scores['baseline']['n']})"
            )
        print(
            f"{stamp(v.get('at', replay.now()))}  canary verdict {c['arm']}: {c['state']}, "
            f"{v.get('verdict')}: {v.get('reason')}{scored}",
            flush=True,
        )
    return {"requests": sent, "states": states, "verdicts": verdicts}


def watch(box: Served, replay: Replay, stop: threading.Event, events: list[dict[str, Any]]) -> None:
    """Print each pre-warm decision and alert change once, with the replayed time."""
    seen: set[str] = set()
    while not stop.is_set():
        try:
            warm = httpx.get(box.url + "/v1/admin/prewarm", headers=box.admin, timeout=10).json()
            alerts = httpx.get(box.url + "/console/data/alerts", headers=box.admin, timeout=10)
            canaries = httpx.get(box.url + "/console/data/canaries", headers=box.admin, timeout=10)
        except httpx.HTTPError:
            time.sleep(0.2)
            continue
        found = [
            (
                f"prewarm {d['at']} {d['model']}",
                d["at"],
                f"{d['action']} {d['model']}: {d['reason']}",
            )
            for d in reversed(warm["decisions"])
        ]
        for a in reversed(alerts.json()["recent"]):
            name = a["labels"].get("alertname", "?")
            key = f"alert {a['fingerprint']} {a['status']} {a['startsAt']}"
            # The server stamps alerts on its replay's clock.
            at = a["endsAt"] if a["status"] == "resolved" else a["startsAt"]
            when = datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()
            found.append((key, when, f"alert {name} {a['status']}: {a['annotations']['summary']}"))
        for c in canaries.json()["canaries"]:
            for e in reversed(c["events"]):
                who = "automatic" if e["automatic"] else e["actor_name"]
                found.append(
                    (
                        f"canary {e['seq']}",
                        e["at"],
                        f"canary {e['action']} {c['arm']} ({c['model']} on tier {c['tier']}, "
                        f"{who}): {e['reason']}",
                    )
                )
        for key, at, what in found:
            if key not in seen:
                seen.add(key)
                events.append({"at": at, "when": stamp(at), "what": what})
                print(f"{stamp(at)}  {what}", flush=True)
        time.sleep(0.25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--day-s", type=float, default=96.0, help="real seconds per replayed day")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    speed = 86400.0 / args.day_s
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        tiny = make_tiny_gguf(where / "tiny.gguf")
        paid_model = make_tiny_gguf(where / "paid.gguf", seed=77)
        box = Served(
            where,
            model=tiny,
            policy=policy(where),
            env={
                "CHATBOX_REPLAY_START": str(MONDAY + START_H * H),
                "CHATBOX_REPLAY_SPEED": str(speed),
                "CHATBOX_CONSOLE_SAMPLE_S": "1",
                "CHATBOX_PREWARM_IDLE_S": "1800",
            },
        )
        box.cli("models", "add", str(paid_model), "--name", "paid", "--link")
        # The slower canary: the same kind of model with 6 times the layers, 4 times the width.
        slow = make_tiny_gguf(where / "slow.gguf", n_layer=12, n_embd=256, n_head=8, n_ff=1024)
        box.cli("models", "add", str(slow), "--name", "slow", "--link")
        worse = pick_worse(box, where)
        box.cli("models", "add", str(worse), "--name", "worse", "--link")
        seed_history(box.data_dir / "chatbox.db")
        # People first: the replay's clock starts with the server.
        free = [box.user(f"free{i}") for i in range(3)]
        paid = [box.user(f"paid{i}", tier="paid") for i in range(6)]
        beta = [box.user(f"beta{i}", tier="beta") for i in range(4)]
        gamma = [box.user(f"gamma{i}", tier="gamma") for i in range(4)]
        with box:
            replay = Replay(box, speed)
            print(
                f"replaying {stamp(replay.now())} to Mon {END_H}:00 UTC at {speed:.0f}x", flush=True
            )
            stop = threading.Event()
            events: list[dict[str, Any]] = []
            watcher = threading.Thread(target=watch, args=(box, replay, stop, events), daemon=True)
            watcher.start()
            try:
                canaries: dict[str, Any] = {}

                def canary_traffic() -> None:
                    canaries.update(canary_phase(box, replay, beta, gamma, stop))

                beside = threading.Thread(target=canary_traffic, daemon=True)
                beside.start()
                sent = traffic(box, replay, free, paid, stop)
                beside.join()
                replay.wait_until(MONDAY + END_H * H)
                time.sleep(3.0)  # the last changes come in
            finally:
                stop.set()
                watcher.join(timeout=5)
        print("requests by status:", json.dumps(sent, sort_keys=True))
        print("canary traffic:", json.dumps(canaries, sort_keys=True))
        if args.out is not None:
            result = {"speed": speed, "events": events, "requests": sent, "canaries": canaries}
            args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
