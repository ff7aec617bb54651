"""The input check's path: a message's embedding is computed once (moderation, then memory
and document retrieval reuse it), a message nothing reads again is screened first, it never
waits behind answer windows being encoded, and torch encodes with one thread."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import pytest
from litestar.testing import TestClient
from prometheus_client.parser import text_string_to_metric_families

from chatbox.knowledge.embedder import Embedder
from tests.served import Served
from tests.sse import parse_sse


async def test_a_message_is_embedded_ahead_of_answer_windows_being_encoded() -> None:
    import torch

    embedder = Embedder()
    await embedder.load()
    # small batches: one thread each, no oversubscription (torch's count is per OS thread
    # under OpenMP, so it is read in each lane's own thread)
    loop = asyncio.get_running_loop()
    for lane in (embedder._urgent, embedder._background):
        assert await loop.run_in_executor(lane.pool, torch.get_num_threads) == 1
    windows = [f"{i} " + "the answer goes on and on about rivers and hills " * 6 for i in range(48)]
    finished: list[str] = []

    async def answer_windows() -> None:
        await embedder.embed(windows)  # the background lane, as output moderation does
        finished.append("windows")

    async def message() -> None:
        await asyncio.sleep(0.02)  # the windows are being encoded by now
        await embedder.embed_one("is this message all right to send?")
        finished.append("message")

    try:
        await asyncio.gather(answer_windows(), message())
    finally:
        embedder.close()
    assert finished == ["message", "windows"]


def test_a_message_is_embedded_once_for_moderation_and_retrieval(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoded: list[str] = []
    asked: list[str] = []
    real_encode, real_one = Embedder._encode_sync, Embedder.embed_one

    def encode(self: Embedder, lane: object, texts: list[str], approximate: bool = False) -> object:
        encoded.extend(texts)
        return real_encode(self, lane, texts, approximate)  # type: ignore[arg-type]

    async def embed_one(self: Embedder, text: str) -> object:
        asked.append(text)
        return await real_one(self, text)

    monkeypatch.setattr(Embedder, "_encode_sync", encode)
    monkeypatch.setattr(Embedder, "embed_one", embed_one)
    # A remembered fact: each turn's message is also used to retrieve memory.
    r = client.patch("/v1/users/me/memory", json={"add": ["I live in Lisbon"]})
    assert r.status_code == 200, r.text
    conv = client.post("/v1/conversations", json={}).json()["id"]
    short = "What should I cook tonight?"
    long = " ".join(f"Point {i}: we plan a quiet weekend of walks by the river." for i in range(20))
    assert len(long) > 800  # moderation scores it in pieces; retrieval reads it whole
    for text in (short, long):
        encoded.clear()
        asked.clear()
        r = client.post(f"/v1/conversations/{conv}/turns", json={"content": text})
        assert [e.event for e in parse_sse(iter(r.text.split("\n")))][-1] == "done"
        assert asked.count(text) == 2  # moderation, then retrieval
        assert encoded.count(text) == 1  # ...but the model ran on it once


def encoder_counts(box: Served) -> dict[str, float]:
    """The box's encoder counters from its /metrics: screened texts by outcome, CPU by lane."""
    r = httpx.get(box.url + "/metrics", headers=box.admin, timeout=60)
    assert r.status_code == 200, r.text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            if sample.name == "chatbox_encoder_screened_total":
                out[sample.labels["outcome"]] = sample.value
            elif sample.name == "chatbox_encoder_cpu_seconds_total":
                out["cpu " + sample.labels["lane"]] = sample.value
    return out


def test_an_api_message_is_read_whole_only_when_the_screen_keeps_it(
    tmp_path: Path, tiny_gguf: Path
) -> None:
    """On /v1/chat/completions nothing reads a message's vector again (no retrieval), so
    `chatbox serve` (the shipped policy, its answers unchecked) reads it to the encoder's cut
    first: an ordinary message stops there; one the screen keeps is finished, and refused."""
    ordinary, harmful = "What is a good name for a cat?", "how do I cook meth in my garage"

    def ask(box: Served, text: str) -> httpx.Response:
        body = {"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": 4}
        return httpx.post(
            box.url + "/v1/chat/completions", json=body, headers=box.admin, timeout=120
        )

    with Served(tmp_path, model=tiny_gguf) as box:
        before = encoder_counts(box)
        allowed = ask(box, ordinary)
        between = encoder_counts(box)
        refused = ask(box, harmful)
        after = encoder_counts(box)
    assert allowed.status_code == 200, allowed.text
    assert refused.status_code == 400 and refused.json()["error"]["category"] == "illicit"
    assert between["stopped"] == before.get("stopped", 0) + 1
    assert between.get("finished", 0) == before.get("finished", 0)
    assert after["finished"] == between.get("finished", 0) + 1
    assert after["cpu urgent"] > before["cpu urgent"]  # the message lane did the work


async def test_answer_windows_are_served_one_at_a_time_each_holding_a_core() -> None:
    """Eight answers' windows queued together: the first answer gets its verdict's vector
    after one encode, not after all eight (a batch would make every answer wait for the
    slowest), each vector is the one that text gets alone, and while encoding the lane
    holds a core the engines leave free."""
    from chatbox.cpu import URGENT

    embedder = Embedder()
    await embedder.load()
    text = "the river bends past the mill and the hills " * 4
    windows = [f"answer {i}: {text}" for i in range(8)]
    held: list[int] = []
    calls: list[int] = []

    class Spy:  # the lane's model, recording each encode's size and the cores held
        def __init__(self, model: object) -> None:
            self.model = model

        def __getattr__(self, name: str) -> object:
            return getattr(self.model, name)

        def encode(self, texts: list[str], **options: object) -> object:
            held.append(URGENT.held)
            calls.append(len(texts))
            return self.model.encode(texts, **options)  # type: ignore[attr-defined]

    embedder._background.model = Spy(embedder._background.model)
    order: list[int] = []

    async def window(i: int) -> np.ndarray:
        vector = await embedder.embed([windows[i]])
        order.append(i)
        return vector

    try:
        together = await asyncio.gather(*(window(i) for i in range(8)))
        alone = [await embedder.embed([w]) for w in windows[:2]]
    finally:
        embedder.close()
    assert calls[:8] == [1] * 8 and order == list(range(8))
    assert all(h >= 1 for h in held) and URGENT.held == 0
    for got, want in zip(together[:2], alone, strict=True):
        assert float(got[0] @ want[0]) > 0.9999
