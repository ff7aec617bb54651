"""Knowledge API: OpenAI-compatible embeddings, memory, documents, citations and search."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from litestar import Controller, Request, delete, get, patch, post
from litestar.params import Parameter
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT

import chatbox.web.urls as urls
from chatbox.accounts import User
from chatbox.chat import InvalidInput, UnknownModel
from chatbox.knowledge import Chunk, Document, Knowledge, Memory, NotFoundError
from chatbox.knowledge.search import HIT_END, HIT_START
from chatbox.settings import Settings
from chatbox.web.deps import KnowledgeDep, SettingsDep, UserDep
from chatbox.web.errors import ERROR_RESPONSES, OPENAI_EXCEPTION_HANDLERS
from chatbox.web.intake import NonEmptyStrings, PositiveId64
from chatbox.web.uploads import NOT_MULTIPART, UploadForm, read_upload

EMBEDDING_MODEL = "all-MiniLM-L6-v2"
EMBEDDING_DIMENSIONS = 384  # MiniLM's whole vector; it is not trained to be cut shorter
MAX_EMBED_INPUTS = 2048


@dataclass
class EmbeddingsIn:
    input: str | NonEmptyStrings
    model: str | None = None
    encoding_format: str = "float"
    user: str | None = None
    dimensions: int | None = None


@dataclass
class MemoryPatch:
    add: list[str] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)
    enabled: bool | None = None


def memory_out(m: Memory) -> dict[str, Any]:
    return {
        "id": m.id,
        "text": m.text,
        "source": m.source,
        "conversation_id": m.conversation_id,
        "created_at": m.created_at,
        "updated_at": m.updated_at,
    }


def document_out(d: Document) -> dict[str, Any]:
    return {
        "id": d.id,
        "object": "document",
        "name": d.name,
        "mime": d.mime,
        "size_bytes": d.size_bytes,
        "pages": d.pages,
        "chars": d.chars,
        "chunks": d.chunks,
        "conversation_id": d.conversation_id,
        "created_at": d.created_at,
    }


def passage_out(c: Chunk) -> dict[str, Any]:
    return {
        "chunk_id": c.seq,
        "document_id": c.document_id,
        "document_name": c.document_name,
        "ord": c.ord,
        "page": c.page,
        "text": c.text,
    }


def highlight(snippet: str) -> str:
    """A search snippet as safe HTML: escaped text, matched words in <mark>."""
    return html.escape(snippet).replace(HIT_START, "<mark>").replace(HIT_END, "</mark>")


def _memory_owner(actor: User, user_id: str) -> User:
    """`me` or one's own id. Memory is content, and content is its owner's alone: any other
    id is simply not found, for admins too (they see usage, not content)."""
    if user_id in ("me", actor.id):
        return actor
    raise NotFoundError("user not found")


class KnowledgeController(Controller):
    path = "/v1"
    tags = ["knowledge"]

    @post(
        "/embeddings",
        status_code=200,
        exception_handlers=OPENAI_EXCEPTION_HANDLERS,
        responses=ERROR_RESPONSES,
    )
    async def embeddings(
        self, knowledge: KnowledgeDep, settings: SettingsDep, user: UserDep, data: EmbeddingsIn
    ) -> dict[str, Any]:
        """OpenAI-compatible embeddings (all-MiniLM-L6-v2, 384 dimensions, unit length)."""
        texts = [data.input] if isinstance(data.input, str) else list(data.input)
        if not texts or len(texts) > MAX_EMBED_INPUTS or not all(isinstance(t, str) for t in texts):
            raise InvalidInput(f"input must be a string or 1..{MAX_EMBED_INPUTS} strings", "input")
        _check_embedding_input(texts, settings)
        if data.model not in (None, EMBEDDING_MODEL, f"sentence-transformers/{EMBEDDING_MODEL}"):
            raise UnknownModel(str(data.model), [EMBEDDING_MODEL])
        if data.dimensions not in (None, EMBEDDING_DIMENSIONS):
            raise InvalidInput(
                f"dimensions must be {EMBEDDING_DIMENSIONS}: {EMBEDDING_MODEL} is not trained"
                " to be shortened",
                "dimensions",
            )
        if data.encoding_format not in ("float", "base64"):
            raise InvalidInput("encoding_format must be float or base64", "encoding_format")
        vectors, tokens = await knowledge.embedder.embed_with_usage(texts)
        return {
            "object": "list",
            "model": EMBEDDING_MODEL,
            "data": [
                {"object": "embedding", "index": i, "embedding": _encode(v, data.encoding_format)}
                for i, v in enumerate(vectors)
            ],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    # -- memory --------------------------------------------------------------------------

    @get("/users/{user_id:str}/memory")
    async def read_memory(
        self, knowledge: KnowledgeDep, user: UserDep, user_id: str
    ) -> dict[str, Any]:
        """The facts remembered about the caller (`me`, or one's own id; no one else's)."""
        owner = _memory_owner(user, user_id)
        facts = await knowledge.memory.list(owner.id)
        return {
            "object": "list",
            "user_id": owner.id,
            "enabled": await knowledge.memory.enabled(owner.id),
            "data": [memory_out(m) for m in facts],
        }

    @patch("/users/{user_id:str}/memory")
    async def change_memory(
        self,
        knowledge: KnowledgeDep,
        settings: SettingsDep,
        user: UserDep,
        user_id: str,
        data: MemoryPatch,
    ) -> dict[str, Any]:
        """Add facts, remove facts by id, or switch memory on or off."""
        _check_facts(data.add, settings)
        owner = _memory_owner(user, user_id)
        memory = knowledge.memory
        missing = await memory.missing(owner.id, data.remove)
        if missing:  # all or nothing: an unknown id changes nothing
            raise NotFoundError(f"memory {missing[0]} not found")
        if any(not isinstance(t, str) or not t.strip() for t in data.add):
            raise InvalidInput("each fact to add must be non-empty text", "add")
        removed = await memory.remove(owner.id, data.remove)
        changes = await memory.add(owner.id, data.add, "explicit")
        if data.enabled is not None:
            await memory.set_enabled(owner.id, data.enabled)
        return {
            "user_id": owner.id,
            "enabled": await memory.enabled(owner.id),
            "removed": removed,
            "added": [
                {**memory_out(c.memory), "action": c.action, "previous": c.previous}
                for c in changes
            ],
            "data": [memory_out(m) for m in await memory.list(owner.id)],
        }

    @delete("/users/{user_id:str}/memory/{fact_id:str}", status_code=HTTP_204_NO_CONTENT)
    async def forget_fact(
        self, knowledge: KnowledgeDep, user: UserDep, user_id: str, fact_id: str
    ) -> None:
        owner = _memory_owner(user, user_id)
        if not await knowledge.memory.remove(owner.id, [fact_id]):
            raise NotFoundError("memory not found")

    # -- documents -----------------------------------------------------------------------

    @post("/documents", status_code=HTTP_201_CREATED, request_max_body_size=None)
    async def upload(
        self,
        request: Request[Any, Any, Any],
        knowledge: KnowledgeDep,
        user: UserDep,
        conversation_id: str | None = None,
    ) -> dict[str, Any]:
        """Upload a file (multipart field `file`) to the library, or to a conversation."""
        return document_out(await receive_upload(request, knowledge, user, conversation_id))

    @post(
        "/conversations/{conv_id:str}/documents",
        status_code=HTTP_201_CREATED,
        request_max_body_size=None,
    )
    async def upload_to_conversation(
        self, request: Request[Any, Any, Any], knowledge: KnowledgeDep, user: UserDep, conv_id: str
    ) -> dict[str, Any]:
        return document_out(await receive_upload(request, knowledge, user, conv_id))

    @get("/documents")
    async def list_documents(
        self, knowledge: KnowledgeDep, user: UserDep, conversation_id: str | None = None
    ) -> dict[str, Any]:
        docs = await knowledge.documents.list(user.id, conversation_id)
        return {"object": "list", "data": [document_out(d) for d in docs]}

    @get("/documents/{doc_id:str}")
    async def read_document(
        self, knowledge: KnowledgeDep, user: UserDep, doc_id: str
    ) -> dict[str, Any]:
        return document_out(await knowledge.documents.get(user.id, doc_id))

    @delete("/documents/{doc_id:str}", status_code=HTTP_204_NO_CONTENT)
    async def delete_document(self, knowledge: KnowledgeDep, user: UserDep, doc_id: str) -> None:
        await knowledge.documents.delete(user.id, doc_id)

    @get("/passages/{chunk_id:int}")
    async def passage(
        self, knowledge: KnowledgeDep, user: UserDep, chunk_id: PositiveId64
    ) -> dict[str, Any]:
        """One document passage (what a citation points at)."""
        return passage_out(await knowledge.documents.passage(user.id, chunk_id))

    @get("/conversations/{conv_id:str}/turns/{turn_id:str}/citations")
    async def citations(
        self, knowledge: KnowledgeDep, user: UserDep, conv_id: str, turn_id: str
    ) -> dict[str, Any]:
        """The document passages an answer drew on, in the order it was given them."""
        cited = await knowledge.documents.turn_citations(user.id, conv_id, turn_id)
        return {
            "object": "list",
            "turn_id": turn_id,
            "data": [{"n": i + 1, **passage_out(c)} for i, c in enumerate(cited)],
        }

    # -- search --------------------------------------------------------------------------

    @get("/search")
    async def search(
        self,
        knowledge: KnowledgeDep,
        user: UserDep,
        q: str,
        mode: str = Parameter(default="both", pattern="^(words|meaning|both)$"),
        limit: int = Parameter(default=20, ge=1, le=100),
    ) -> dict[str, Any]:
        """Search the conversations one may see by words (all of them) and by meaning (those
        one started)."""
        hits = await knowledge.search.search(user.id, q, mode, limit)
        return {
            "object": "list",
            "query": q,
            "data": [
                {
                    "turn_id": h.turn_id,
                    "conversation_id": h.conversation_id,
                    "title": h.title,
                    "role": h.role,
                    "match": h.match,
                    "score": round(h.score, 4),
                    "snippet": h.snippet.replace(HIT_START, "").replace(HIT_END, ""),
                    "highlighted": highlight(h.snippet),
                    "created_at": h.created_at,
                    "url": urls.conversation(h.conversation_id, turn=h.turn_id),
                }
                for h in hits
            ],
        }


async def receive_upload(
    request: Request[Any, Any, Any],
    knowledge: Knowledge,
    user: User,
    conversation_id: str | None,
    *,
    library: bool = False,
    form: UploadForm | None = None,
) -> Document:
    """Read the multipart field `file` (streamed, refused once past the cap) and ingest it.

    With no conversation id the form's `conversation_id` field may name one; `library=True`
    ignores that field, so the file always goes to the user's library. A route that had to
    read the form first passes it as `form` (read with `read_upload`, so within the cap).
    """
    if form is None:
        form = await read_upload(request, knowledge.documents.max_bytes)
    upload = form.file
    if upload is None:
        raise InvalidInput(NOT_MULTIPART, "file")
    if not library:
        conversation_id = conversation_id or form.get("conversation_id") or None
    return await knowledge.documents.ingest(
        user.id, conversation_id, upload.filename, upload.content_type, upload.data
    )


def _check_embedding_input(texts: list[str], settings: Settings) -> None:
    """Each input, and all of them together, within the settings' character limits."""
    each, total = settings.max_embedding_input_chars, settings.max_embedding_total_chars
    for i, text in enumerate(texts):
        if len(text) > each:
            raise InvalidInput(
                f"input[{i}] is {len(text):,} characters; the limit is {each:,}", "input"
            )
    chars = sum(len(t) for t in texts)
    if chars > total:
        raise InvalidInput(f"input is {chars:,} characters in all; the limit is {total:,}", "input")


def _check_facts(facts: list[str], settings: Settings) -> None:
    """A memory PATCH adds at most so many facts, each at most so long."""
    if len(facts) > settings.max_memory_add:
        raise InvalidInput(
            f"add has {len(facts):,} facts; the limit is {settings.max_memory_add:,}", "add"
        )
    for i, fact in enumerate(facts):
        if isinstance(fact, str) and len(fact) > settings.max_fact_chars:
            raise InvalidInput(
                f"add[{i}] is {len(fact):,} characters; the limit is {settings.max_fact_chars:,}",
                "add",
            )


def _encode(vector: np.ndarray, fmt: str) -> list[float] | str:
    if fmt == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return [float(x) for x in vector]
