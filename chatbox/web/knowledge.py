"""Knowledge API: OpenAI-compatible embeddings, memory, documents, citations and search."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from litestar import Controller, MediaType, Request, Response, delete, get, patch, post
from litestar.datastructures import UploadFile
from litestar.params import Parameter
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT

from chatbox.knowledge import (
    EmbeddingUnavailable,
    EmptyFile,
    EncryptedFile,
    FileTooLarge,
    Knowledge,
    KnowledgeError,
    NotFoundError,
    RejectedFile,
    UnsupportedFile,
)
from chatbox.store import Chunk, Document, Memory, Store, User
from chatbox.store.search import HIT_END, HIT_START
from chatbox.web.deps import StoreDep, UserDep
from chatbox.web.errors import error_body

EMBEDDING_MODEL = "all-MiniLM-L6-v2"
MAX_EMBED_INPUTS = 2048
_REJECTED: list[tuple[type[RejectedFile], int]] = [
    (FileTooLarge, 413), (UnsupportedFile, 415), (EncryptedFile, 422), (EmptyFile, 422),
]


def knowledge_status(exc: Exception) -> tuple[int, str]:
    """The HTTP status and error kind of a knowledge-layer error."""
    status, kind = 500, "server_error"
    if isinstance(exc, _Invalid):
        status, kind = exc.status, exc.kind
    elif isinstance(exc, NotFoundError):
        status, kind = 404, "not_found"
    elif isinstance(exc, RejectedFile):
        status = next((code for cls, code in _REJECTED if isinstance(exc, cls)), 422)
        kind = exc.reason
    elif isinstance(exc, EmbeddingUnavailable):
        status, kind = 503, "embeddings_unavailable"
    return status, kind


def knowledge_error_handler(_: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    status, kind = knowledge_status(exc)
    return Response(error_body(str(exc), kind), status_code=status, media_type=MediaType.JSON)


def knowledge_of(request: Request[Any, Any, Any]) -> Knowledge:
    """The app's knowledge services (embeddings, memory, documents, search)."""
    knowledge: Knowledge = request.app.state.knowledge
    return knowledge


@dataclass
class EmbeddingsIn:
    input: str | list[str]
    model: str | None = None
    encoding_format: str = "float"
    user: str | None = None


@dataclass
class MemoryPatch:
    add: list[str] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)
    enabled: bool | None = None


def memory_out(m: Memory) -> dict[str, Any]:
    return {"id": m.id, "text": m.text, "source": m.source,
            "conversation_id": m.conversation_id, "created_at": m.created_at,
            "updated_at": m.updated_at}


def document_out(d: Document) -> dict[str, Any]:
    return {"id": d.id, "object": "document", "name": d.name, "mime": d.mime,
            "size_bytes": d.size_bytes, "pages": d.pages, "chars": d.chars, "chunks": d.chunks,
            "conversation_id": d.conversation_id, "created_at": d.created_at}


def passage_out(c: Chunk) -> dict[str, Any]:
    return {"chunk_id": c.seq, "document_id": c.document_id, "document_name": c.document_name,
            "ord": c.ord, "page": c.page, "text": c.text}


def highlight(snippet: str) -> str:
    """A search snippet as safe HTML: escaped text, matched words in <mark>."""
    return html.escape(snippet).replace(HIT_START, "<mark>").replace(HIT_END, "</mark>")


async def _memory_owner(store: Store, actor: User, user_id: str) -> User:
    """`me`, or (for admins) any user; anyone else's id is simply not found."""
    if user_id in ("me", actor.id):
        return actor
    if actor.role != "admin":
        raise NotFoundError("user not found")
    owner = await store.users.get(user_id)
    if owner is None:
        raise NotFoundError("user not found")
    return owner


class KnowledgeController(Controller):
    path = "/v1"
    tags = ["knowledge"]
    exception_handlers = {KnowledgeError: knowledge_error_handler,
                          EmbeddingUnavailable: knowledge_error_handler}

    @post("/embeddings", status_code=200)
    async def embeddings(self, request: Request[Any, Any, Any], user: UserDep,
                         data: EmbeddingsIn) -> dict[str, Any]:
        """OpenAI-compatible embeddings (all-MiniLM-L6-v2, 384 dimensions, unit length)."""
        texts = [data.input] if isinstance(data.input, str) else list(data.input)
        if not texts or len(texts) > MAX_EMBED_INPUTS or not all(isinstance(t, str)
                                                                 for t in texts):
            raise _invalid(f"input must be a string or 1..{MAX_EMBED_INPUTS} strings")
        if data.model not in (None, EMBEDDING_MODEL, f"sentence-transformers/{EMBEDDING_MODEL}"):
            raise _invalid(f"unknown embedding model {data.model!r}; use {EMBEDDING_MODEL!r}",
                           404, "model_not_found")
        if data.encoding_format not in ("float", "base64"):
            raise _invalid("encoding_format must be float or base64")
        vectors, tokens = await knowledge_of(request).embedder.embed_with_usage(texts)
        return {
            "object": "list", "model": EMBEDDING_MODEL,
            "data": [{"object": "embedding", "index": i, "embedding": _encode(v,
                                                                             data.encoding_format)}
                     for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    # -- memory --------------------------------------------------------------------------

    @get("/users/{user_id:str}/memory")
    async def read_memory(self, request: Request[Any, Any, Any], store: StoreDep,
                          user: UserDep, user_id: str) -> dict[str, Any]:
        """The facts remembered about a user (`me`; admins: any user id)."""
        owner = await _memory_owner(store, user, user_id)
        knowledge = knowledge_of(request)
        facts = await knowledge.memory.list(owner.id)
        return {"object": "list", "user_id": owner.id,
                "enabled": await knowledge.memory.enabled(owner.id),
                "data": [memory_out(m) for m in facts]}

    @patch("/users/{user_id:str}/memory")
    async def change_memory(self, request: Request[Any, Any, Any], store: StoreDep,
                            user: UserDep, user_id: str, data: MemoryPatch) -> dict[str, Any]:
        """Add facts, remove facts by id, or switch memory on or off."""
        owner = await _memory_owner(store, user, user_id)
        memory = knowledge_of(request).memory
        for fact_id in data.remove:  # all or nothing: an unknown id changes nothing
            if await store.memories.get(owner.id, fact_id) is None:
                raise NotFoundError(f"memory {fact_id} not found")
        if any(not isinstance(t, str) or not t.strip() for t in data.add):
            raise _invalid("each fact to add must be non-empty text")
        removed = await memory.remove(owner.id, data.remove)
        changes = await memory.add(owner.id, data.add, "explicit")
        if data.enabled is not None:
            await memory.set_enabled(owner.id, data.enabled)
        return {"user_id": owner.id, "enabled": await memory.enabled(owner.id),
                "removed": removed,
                "added": [{**memory_out(c.memory), "action": c.action, "previous": c.previous}
                          for c in changes],
                "data": [memory_out(m) for m in await memory.list(owner.id)]}

    @delete("/users/{user_id:str}/memory/{fact_id:str}", status_code=HTTP_204_NO_CONTENT)
    async def forget_fact(self, request: Request[Any, Any, Any], store: StoreDep, user: UserDep,
                          user_id: str, fact_id: str) -> None:
        owner = await _memory_owner(store, user, user_id)
        if not await knowledge_of(request).memory.remove(owner.id, [fact_id]):
            raise NotFoundError("memory not found")

    # -- documents -----------------------------------------------------------------------

    @post("/documents", status_code=HTTP_201_CREATED, request_max_body_size=None)
    async def upload(self, request: Request[Any, Any, Any], user: UserDep,
                     conversation_id: str | None = None) -> dict[str, Any]:
        """Upload a file (multipart field `file`) to the library, or to a conversation."""
        return await receive_upload(request, user, conversation_id)

    @post("/conversations/{conv_id:str}/documents", status_code=HTTP_201_CREATED,
          request_max_body_size=None)
    async def upload_to_conversation(self, request: Request[Any, Any, Any], user: UserDep,
                                     conv_id: str) -> dict[str, Any]:
        return await receive_upload(request, user, conv_id)

    @get("/documents")
    async def list_documents(self, store: StoreDep, user: UserDep,
                             conversation_id: str | None = None) -> dict[str, Any]:
        docs = await store.documents.list(user.id, conversation_id)
        return {"object": "list", "data": [document_out(d) for d in docs]}

    @get("/documents/{doc_id:str}")
    async def read_document(self, request: Request[Any, Any, Any], store: StoreDep,
                            user: UserDep, doc_id: str) -> dict[str, Any]:
        doc = await knowledge_of(request).documents.get(user.id, doc_id)
        return document_out(doc)

    @delete("/documents/{doc_id:str}", status_code=HTTP_204_NO_CONTENT)
    async def delete_document(self, request: Request[Any, Any, Any], user: UserDep,
                              doc_id: str) -> None:
        await knowledge_of(request).documents.delete(user.id, doc_id)

    @get("/passages/{chunk_id:int}")
    async def passage(self, store: StoreDep, user: UserDep, chunk_id: int) -> dict[str, Any]:
        """One document passage (what a citation points at)."""
        chunk = await store.documents.chunk(user.id, chunk_id)
        if chunk is None:
            raise NotFoundError("passage not found")
        return passage_out(chunk)

    @get("/conversations/{conv_id:str}/turns/{turn_id:str}/citations")
    async def citations(self, store: StoreDep, user: UserDep, conv_id: str,
                        turn_id: str) -> dict[str, Any]:
        """The document passages an answer drew on, in the order it was given them."""
        if await store.conversations.get(user.id, conv_id) is None or \
                await store.turns.get(conv_id, turn_id) is None:
            raise NotFoundError("turn not found")
        cited = (await store.documents.citations(user.id, [turn_id]))[turn_id]
        return {"object": "list", "turn_id": turn_id,
                "data": [{"n": i + 1, **passage_out(c)} for i, c in enumerate(cited)]}

    # -- search --------------------------------------------------------------------------

    @get("/search")
    async def search(
        self, request: Request[Any, Any, Any], user: UserDep, q: str,
        mode: str = Parameter(default="both", pattern="^(words|meaning|both)$"),
        limit: int = Parameter(default=20, ge=1, le=100),
    ) -> dict[str, Any]:
        """Search one's own conversations by words and by meaning."""
        hits = await knowledge_of(request).search.search(user.id, q, mode, limit)
        return {"object": "list", "query": q, "data": [{
            "turn_id": h.turn_id, "conversation_id": h.conversation_id, "title": h.title,
            "role": h.role, "match": h.match, "score": round(h.score, 4),
            "snippet": h.snippet.replace(HIT_START, "").replace(HIT_END, ""),
            "highlighted": highlight(h.snippet), "created_at": h.created_at,
            "url": f"/c/{h.conversation_id}?turn={h.turn_id}#turn-{h.turn_id}",
        } for h in hits]}


async def receive_upload(request: Request[Any, Any, Any], user: User,
                         conversation_id: str | None, *, library: bool = False
                         ) -> dict[str, Any]:
    """Read the multipart field `file` (refusing an oversized body early) and ingest it.

    With no conversation id the form's `conversation_id` field may name one; `library=True`
    ignores that field, so the file always goes to the user's library.
    """
    knowledge = knowledge_of(request)
    limit = knowledge.documents.max_bytes
    declared = int(request.headers.get("content-length") or 0)
    if declared > limit + 64 * 1024:  # refuse before reading; the form adds a little
        raise FileTooLarge(f"the upload is {declared:,} bytes; the limit is {limit:,} bytes")
    form = await request.form()
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise _invalid("send the file as multipart/form-data in a field named 'file'")
    data = await upload.read()
    if not library:
        conversation_id = conversation_id or (str(form.get("conversation_id") or "") or None)
    doc = await knowledge.documents.ingest(user.id, conversation_id, upload.filename,
                                           upload.content_type, data)
    return document_out(doc)


def _encode(vector: np.ndarray, fmt: str) -> list[float] | str:
    if fmt == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return [float(x) for x in vector]


class _Invalid(KnowledgeError):
    def __init__(self, message: str, status: int, kind: str) -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


def _invalid(message: str, status: int = 422, kind: str = "invalid_request_error") -> _Invalid:
    return _Invalid(message, status, kind)
