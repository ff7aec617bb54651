"""The embedder's lanes: closing them leaves nobody waiting for a vector."""

from __future__ import annotations

import asyncio
import threading

from chatbox.knowledge.embedder import Embedder


async def test_closing_the_embedder_leaves_no_caller_waiting() -> None:
    embedder = Embedder()
    await embedder.load()
    gate = threading.Event()
    embedder._background.pool.submit(gate.wait)  # the lane's thread is busy
    try:
        first = asyncio.ensure_future(embedder.embed(["an answer's window"]))
        second = asyncio.ensure_future(embedder.embed(["another window"]))
        await asyncio.sleep(0.2)  # the first waits for the lane's thread, the second behind it
        embedder.close()
        done, _ = await asyncio.wait({first, second}, timeout=10)
        assert done == {first, second}, "a caller still waits for a closed lane"
        assert first.cancelled() and second.cancelled()
    finally:
        gate.set()
