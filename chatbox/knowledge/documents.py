"""Documents: text extracted from plain text, Markdown, HTML and PDF (extract.py), chunked
with overlap on natural boundaries, embedded, and stored whole (or not at all)."""

from __future__ import annotations

import asyncio
import builtins
import re
import time
from collections.abc import Callable, Sequence
from pathlib import PurePath

from chatbox.knowledge.embedder import Embedder
from chatbox.knowledge.errors import (
    ContentRefused,
    FileTooLarge,
    KnowledgeError,
    NotFoundError,
    NotKept,
)
from chatbox.knowledge.filetext import extract
from chatbox.knowledge.types import KeepsNothing, Screen
from chatbox.store import Chunk, ChunkIn, Document, Store

CHUNK_CHARS = 900  # about 200 tokens: inside MiniLM's 256-token window
MIN_CHUNK_CHARS = 300
OVERLAP_CHARS = 150
_BREAKS = (
    re.compile(r"\n\s*\n"),
    re.compile(r"\n"),
    re.compile(r"[.!?][\"')\]]?\s"),
    re.compile(r"\s"),
)


def _cut(text: str, start: int, size: int) -> int:
    """Where the chunk beginning at start should end: the last natural break in reach."""
    end = min(len(text), start + size)
    if end == len(text):
        return end
    window = text[start + MIN_CHUNK_CHARS : end]
    for pattern in _BREAKS:
        matches = list(pattern.finditer(window))
        if matches:
            return start + MIN_CHUNK_CHARS + matches[-1].end()
    return end


def chunk_text(
    text: str, size: int = CHUNK_CHARS, overlap: int = OVERLAP_CHARS
) -> list[tuple[int, str]]:
    """(start offset, text) chunks of about `size` chars, each overlapping the one before."""
    chunks: list[tuple[int, str]] = []
    start = 0
    while start < len(text):
        end = _cut(text, start, size)
        piece = text[start:end].strip()
        if piece:
            chunks.append((start, piece))
        if end >= len(text):
            break
        nxt = max(start + 1, end - overlap)
        space = text.find(" ", nxt, end)  # begin the overlap at a word
        start = space + 1 if space != -1 else nxt
    return chunks


def chunk_pages(pages: list[tuple[int | None, str]]) -> list[ChunkIn]:
    out: list[ChunkIn] = []
    for page, text in pages:
        for start, piece in chunk_text(text):
            out.append(ChunkIn(len(out), page, start, piece))
    return out


class DocumentService:
    def __init__(
        self,
        store: Store,
        embedder: Embedder,
        max_bytes: int,
        max_chars: int,
        *,
        max_pages: int | None = None,
        max_documents: int | None = None,
        max_user_bytes: int | None = None,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.max_bytes = max_bytes  # one upload
        self.max_chars = max_chars  # one document's text
        self.max_pages = max_pages  # one PDF
        self.max_documents = max_documents  # kept by one user
        self.max_user_bytes = max_user_bytes  # uploaded bytes kept by one user
        self.screen: Screen | None = None  # moderation, before a document can be cited
        self.keeps_nothing: KeepsNothing | None = None  # the user's zero-data-retention
        # Told (outcome: stored, rejected, failed; seconds) of each ingestion (metrics).
        self.on_ingest: Callable[[str, float], None] | None = None

    async def ingest(
        self,
        user_id: str,
        conversation_id: str | None,
        filename: str,
        content_type: str | None,
        data: bytes,
        workspace_id: str | None = None,
    ) -> Document:
        """Extract, chunk, embed and store a file; raises a RejectedFile kind, storing nothing.
        A file for a workspace conversation (or `workspace_id`) joins that workspace."""
        t0 = time.perf_counter()
        outcome = "failed"
        try:
            doc = await self._ingest(
                user_id, conversation_id, filename, content_type, data, workspace_id
            )
            outcome = "stored"
            return doc
        except KnowledgeError:
            outcome = "rejected"
            raise
        finally:
            if self.on_ingest is not None:
                self.on_ingest(outcome, time.perf_counter() - t0)

    async def _ingest(
        self,
        user_id: str,
        conversation_id: str | None,
        filename: str,
        content_type: str | None,
        data: bytes,
        workspace_id: str | None = None,
    ) -> Document:
        name = PurePath(filename or "document").name[:200] or "document"
        if self.keeps_nothing is not None and await self.keeps_nothing(user_id):
            raise NotKept(
                f"{name} was not stored: your account keeps no content (zero-data-retention)"
            )
        if len(data) > self.max_bytes:
            raise FileTooLarge(
                f"{name} is {len(data):,} bytes; the limit is {self.max_bytes:,} bytes"
            )
        if conversation_id is not None:
            conv = await self.store.conversations.get(user_id, conversation_id)
            if conv is None:
                raise NotFoundError("conversation not found")
            workspace_id = conv.workspace_id
        elif workspace_id and await self.store.workspaces.role(workspace_id, user_id) is None:
            raise NotFoundError("workspace not found")
        await self._check_room(user_id, name, len(data))
        extracted = await asyncio.to_thread(extract, name, content_type, data, self.max_pages)
        chars = sum(len(t) for _, t in extracted.pages)
        if chars > self.max_chars:
            raise FileTooLarge(
                f"{name} holds {chars:,} characters of text; the limit is {self.max_chars:,}"
            )
        chunks = await asyncio.to_thread(chunk_pages, extracted.pages)
        if self.screen is not None:
            reason = await self.screen(user_id, [c.text for c in chunks], "document", name)
            if reason is not None:
                raise ContentRefused(reason)
        vectors = await self.embedder.embed([c.text for c in chunks])
        return await self.store.documents.create(
            user_id,
            conversation_id,
            name,
            extracted.mime,
            len(data),
            extracted.page_count,
            chunks,
            vectors,
            workspace_id,
        )

    async def _check_room(self, user_id: str, name: str, size: int) -> None:
        """The user's documents, with this one, within the per-user count and bytes."""
        if self.max_documents is None and self.max_user_bytes is None:
            return
        count, used = await self.store.documents.totals(user_id)
        if self.max_documents is not None and count >= self.max_documents:
            raise FileTooLarge(
                f"you have {count:,} documents; the limit is "
                f"{self.max_documents:,} documents (delete some to add {name})"
            )
        if self.max_user_bytes is not None and used + size > self.max_user_bytes:
            raise FileTooLarge(
                f"your documents take {used:,} bytes and {name} is {size:,} "
                f"more; the limit is {self.max_user_bytes:,} bytes per user"
            )

    async def get(self, user_id: str, doc_id: str) -> Document:
        doc = await self.store.documents.get(user_id, doc_id)
        if doc is None:
            raise NotFoundError("document not found")
        return doc

    async def delete(self, user_id: str, doc_id: str) -> None:
        if not await self.store.documents.delete(user_id, doc_id):
            raise NotFoundError("document not found")

    async def list(
        self, user_id: str, conversation_id: str | None = None, library: bool = False
    ) -> builtins.list[Document]:
        """The user's documents: all, one conversation's, or (library=True) the library's."""
        return await self.store.documents.list(user_id, conversation_id, library)

    async def attached(self, user_id: str, conversation_id: str) -> builtins.list[Document]:
        """The documents attached to one of the user's conversations (404 for others')."""
        if await self.store.conversations.get(user_id, conversation_id) is None:
            raise NotFoundError("conversation not found")
        return await self.store.documents.list(user_id, conversation_id)

    async def passage(self, user_id: str, chunk_seq: int) -> Chunk:
        """One passage of the user's documents (what a citation points at)."""
        chunk = await self.store.documents.chunk(user_id, chunk_seq)
        if chunk is None:
            raise NotFoundError("passage not found")
        return chunk

    async def citations(
        self, user_id: str, turn_ids: Sequence[str]
    ) -> dict[str, builtins.list[Chunk]]:
        """For each answer, the passages it cited that still exist."""
        return await self.store.documents.citations(user_id, turn_ids)

    async def turn_citations(
        self, user_id: str, conversation_id: str, turn_id: str
    ) -> builtins.list[Chunk]:
        """The passages one answer of the user's conversation drew on, in order."""
        if (
            await self.store.conversations.get(user_id, conversation_id) is None
            or await self.store.turns.get(conversation_id, turn_id) is None
        ):
            raise NotFoundError("turn not found")
        return (await self.store.documents.citations(user_id, [turn_id]))[turn_id]
