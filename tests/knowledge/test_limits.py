"""Document limits: PDF pages, documents per user and bytes per user."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from chatbox.knowledge import FileTooLarge
from chatbox.knowledge.documents import DocumentService
from chatbox.knowledge.filetext import extract
from chatbox.store import Store


def _pdf(pages: int) -> bytes:
    from pypdf import PdfWriter

    writer, out = PdfWriter(), io.BytesIO()
    for _ in range(pages):
        writer.add_blank_page(width=100, height=100)
    writer.write(out)
    return out.getvalue()


def test_pdf_pages_are_capped_before_extracting() -> None:
    with pytest.raises(FileTooLarge, match="has 5 pages; the limit is 3 pages"):
        extract("five.pdf", "application/pdf", _pdf(5), max_pages=3)


class _FakeEmbedder:
    """Unit vectors without loading a model (these tests are about counting)."""

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        vectors = np.random.default_rng(0).normal(size=(len(texts), 384)).astype(np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_documents_and_bytes_per_user(database: Path | str) -> None:
    async def run() -> None:
        store = await Store.open(database)
        try:
            alice = await store.users.create("alice", role="member", tier="free")
            bob = await store.users.create("bob", role="member", tier="free")
            docs = DocumentService(
                store,
                _FakeEmbedder(),
                10_000,
                100_000,  # type: ignore[arg-type]
                max_documents=2,
                max_user_bytes=1_500,
            )
            text = b"some words to keep " * 30  # 570 bytes
            await docs.ingest(alice.id, None, "a.txt", "text/plain", text)
            await docs.ingest(alice.id, None, "b.txt", "text/plain", text)
            with pytest.raises(FileTooLarge, match="you have 2 documents; the limit is 2"):
                await docs.ingest(alice.id, None, "c.txt", "text/plain", b"short text")
            await docs.ingest(bob.id, None, "a.txt", "text/plain", text)  # per user
            await docs.ingest(bob.id, None, "b.txt", "text/plain", text[:500])
            with pytest.raises(FileTooLarge, match="limit is 2 documents"):
                await docs.ingest(bob.id, None, "c.txt", "text/plain", text)
            docs.max_documents = 10
            with pytest.raises(
                FileTooLarge,
                match=r"take 1,070 bytes and c\.txt is 570 more; "
                r"the limit is 1,500 bytes per user",
            ):
                await docs.ingest(bob.id, None, "c.txt", "text/plain", text)
            assert len(await docs.list(bob.id)) == 2
            # Deleting makes room again.
            short = next(d for d in await docs.list(bob.id) if d.name == "b.txt")
            await docs.delete(bob.id, short.id)
            await docs.ingest(bob.id, None, "c.txt", "text/plain", text)
            assert await store.documents.totals(bob.id) == (2, 570 + 570)
        finally:
            await store.close()

    asyncio.run(run())
