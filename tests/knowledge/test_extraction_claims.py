"""Two fronts on one PostgreSQL database whose idle timers fire for the same conversation:
exactly one of them reads it for facts (and asks the model)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

from chatbox.engine.types import DoneEvent, Engine, GenerationRequest, TokenEvent, Usage
from chatbox.knowledge.extraction import Extractor
from chatbox.knowledge.memory import MemoryService
from chatbox.store import Store
from tests.pg import PgServer


@dataclass
class CountingModel:
    """A model that answers "- none" slowly (the fronts' calls overlap) and counts calls."""

    calls: list[str] = field(default_factory=list)
    info: Any = field(default_factory=lambda: type("Info", (), {"n_ctx_per_seq": 1024})())

    async def submit(self, request: GenerationRequest) -> AsyncIterator[object]:
        self.calls.append(request.messages[-1].content)
        await asyncio.sleep(0.3)
        yield TokenEvent("- none")
        yield DoneEvent("stop", Usage())


class Memory:
    """Memory on, facts counted (each front's memory service)."""

    def __init__(self) -> None:
        self.added: list[str] = []

    async def enabled(self, user_id: str) -> bool:
        return True

    async def add(self, user_id: str, facts: list[str], *_: object) -> list[object]:
        self.added += facts
        return []


async def test_two_fronts_extract_one_conversation_once(postgres: PgServer) -> None:
    url = postgres.fresh_database()
    a, b = await Store.open(url), await Store.open(url)
    try:
        user = await a.users.create("ann")
        conv = await a.conversations.create(user.id)
        await a.turns.append_user(conv.id, None, "I work on the billing service at a bank.")
        model = CountingModel()
        memories = Memory(), Memory()

        async def source() -> Engine:
            return cast(Engine, model)

        fronts = [
            Extractor(store, cast(MemoryService, memory), source, 60.0)
            for store, memory in zip((a, b), memories, strict=True)
        ]
        await asyncio.gather(*(f.extract(user.id, conv.id) for f in fronts))
        assert len(model.calls) == 1  # one front read it; the other skipped the claimed job
        facts = memories[0].added + memories[1].added
        assert facts == ["The user works on the billing service at a bank"]
        # Done and marked: a later timer on either front finds nothing new to read.
        await fronts[1].extract(user.id, conv.id)
        assert len(model.calls) == 1
    finally:
        await a.close()
        await b.close()
