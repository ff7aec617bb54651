"""Another user's writes while a 50 MB ChatGPT import goes in, on the store directly.

    python benchmarks/imports.py [--mb 50] [--every-ms 20] [--json OUT]

Builds a ChatGPT-format conversations.json of about --mb megabytes (conversations of 25
messages of ~1,000 characters), then, on a fresh database in a temporary directory, parses
and imports it as the service does (parse in a thread, then TransferRepo.import_conversations)
while another user appends a turn to their own conversation every --every-ms milliseconds
(store.turns.append_user: one write transaction, as a chat turn's user message is). Each
append's wait is the time from asking to commit. Two runs: the import as one transaction (the
batch limits set past the file's size) and as chatbox writes it (IMPORT_ROWS rows or
IMPORT_CHARS characters a transaction); first, for scale, 5 s of the same writes with no
import. The table gives the other user's waits (p50, p99, max), counted from when each write
was due (so a stalled event loop counts too), how many writes landed during the import, and
the import's own time (parse included).
Target: no other write waits more than 200 ms behind the import.
Results go to benchmarks/results/imports.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from chatbox.data.chatgpt import Limits, parse  # noqa: E402
from chatbox.store import Store  # noqa: E402
from chatbox.store import transfer as transfer_module  # noqa: E402
from chatbox.store.transfer import ConversationIn, TransferRepo  # noqa: E402

SENTENCE = "the otter floats on its back and cracks a shell on a stone held to its chest"


def message(node: str, role: str, parent: str, child: str | None, n: int) -> dict[str, Any]:
    words = SENTENCE.split()
    text = " ".join(words[(n + i) % len(words)] for i in range(170))[:1000]
    return {
        "id": node,
        "message": {
            "id": node,
            "author": {"role": role},
            "content": {"content_type": "text", "parts": [f"{n} {text}"]},
            "create_time": 1_700_000_000.0 + n,
        },
        "parent": parent,
        "children": [child] if child else [],
    }


def chatgpt_file(megabytes: float, per_conv: int = 25) -> bytes:
    """A conversations.json of about `megabytes` MB."""
    convs: list[dict[str, Any]] = []
    size = n = 0
    while size < megabytes * 1_000_000:
        mapping: dict[str, Any] = {"r": {"id": "r", "message": None, "parent": None}}
        mapping["r"]["children"] = ["m0"]
        for i in range(per_conv):
            role = "user" if i % 2 == 0 else "assistant"
            nxt = f"m{i + 1}" if i + 1 < per_conv else None
            mapping[f"m{i}"] = message(f"m{i}", role, "r" if i == 0 else f"m{i - 1}", nxt, n)
            n += 1
        conv = {
            "title": f"chat {len(convs)}",
            "create_time": 1_700_000_000.0,
            "update_time": 1_700_000_000.0 + n,
            "current_node": f"m{per_conv - 1}",
            "mapping": mapping,
        }
        size += len(json.dumps(conv))
        convs.append(conv)
    return json.dumps(convs).encode()


async def run(body: bytes | None, every_s: float, one_transaction: bool) -> dict[str, Any]:
    """One run: the other user's writes during the import (body None: during 5 s of none)."""
    rows, chars = transfer_module.IMPORT_ROWS, transfer_module.IMPORT_CHARS
    if one_transaction:
        transfer_module.IMPORT_ROWS = transfer_module.IMPORT_CHARS = 1 << 40
    with tempfile.TemporaryDirectory() as tmp:
        store = await Store.open(Path(tmp) / "bench.db")
        try:
            importer = await store.users.create("importer")
            writer = await store.users.create("writer")
            conv = await store.conversations.create(writer.id, "busy chatting")
            limits = Limits(64 * 1024 * 1024, 100_000, 1_000, 100_000)
            waits: list[float] = []
            stop = asyncio.Event()

            async def chat() -> None:
                parent = None
                while not stop.is_set():
                    due = time.perf_counter() + every_s
                    await asyncio.sleep(every_s)
                    # From when it was due: a stalled event loop makes a write wait too.
                    turn = await store.turns.append_user(conv.id, parent, "still here")
                    waits.append(time.perf_counter() - due)
                    parent = turn.id

            task = asyncio.create_task(chat())
            await asyncio.sleep(0.5)  # the other user's writes before the import, for scale
            before = len(waits)
            t0 = time.perf_counter()
            if body is None:
                await asyncio.sleep(5.0)
                ids: list[str] = []
                convs: list[ConversationIn] = []
            else:
                parsed = await asyncio.to_thread(parse, body, limits)
                convs = parsed.conversations
                ids = await TransferRepo(store.db).import_conversations(
                    importer.id, convs, imported_at=time.time()
                )
            took = time.perf_counter() - t0
            stop.set()
            await task
            during = waits[before:]
            turns = sum(len(c.turns) for c in convs)
        finally:
            await store.close()
            transfer_module.IMPORT_ROWS, transfer_module.IMPORT_CHARS = rows, chars
    q = statistics.quantiles(during, n=100, method="inclusive") if len(during) > 1 else [0] * 99
    return {
        "mode": "no import"
        if body is None
        else "one transaction"
        if one_transaction
        else "short transactions",
        "conversations": len(ids),
        "messages": turns,
        "import_s": round(took, 2),
        "other_writes": len(during),
        "wait_p50_ms": round(statistics.median(during) * 1000, 1),
        "wait_p99_ms": round(q[98] * 1000, 1),
        "wait_max_ms": round(max(during) * 1000, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=50.0)
    ap.add_argument("--every-ms", type=float, default=20.0)
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results/imports.json")
    args = ap.parse_args()
    body = chatgpt_file(args.mb)
    print(f"conversations.json: {len(body) / 1e6:.1f} MB", file=sys.stderr)
    every = args.every_ms / 1000
    results = [asyncio.run(run(None, every, False))]  # the machine's own noise, for scale
    results += [asyncio.run(run(body, every, one)) for one in (True, False)]
    head = f"{'import written as':<20}{'convs':>7}{'msgs':>8}{'import s':>10}"
    head += f"{'writes':>8}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
    print(head)
    for r in results:
        print(
            f"{r['mode']:<20}{r['conversations']:>7}{r['messages']:>8}{r['import_s']:>10}"
            f"{r['other_writes']:>8}{r['wait_p50_ms']:>9}{r['wait_p99_ms']:>9}"
            f"{r['wait_max_ms']:>9}"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"mb": args.mb, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
