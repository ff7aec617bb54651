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
from msgspec import Struct

from chatbox.accounts import User
from chatbox.chat import InvalidInput, UnknownModel
from chatbox.knowledge import Chunk, Document, Knowledge, NotFoundError, token_ids
from chatbox.knowledge.search import HIT_END, HIT_START
from chatbox.settings import Settings
from chatbox.web.api.schemas import pick
from chatbox.web.auth import AnyRequest
from chatbox.web.deps import KnowledgeDep, SettingsDep, UserDep
from chatbox.web.errors import ERROR_RESPONSES, OPENAI_EXCEPTION_HANDLERS
from chatbox.web.intake import PositiveId64
from chatbox.web.uploads import NOT_MULTIPART, UploadForm, read_upload
from chatbox.web.urls import at_turn, reverse

EMBEDDING_MODEL = "all-MiniLM-L6-v2"
EMBEDDING_DIMENSIONS = 384  # MiniLM's whole vector; it is not trained to be cut shorter
MAX_EMBED_INPUTS = 2048
MAX_TOKEN_IDS = 8192  # in one input sent as token ids (OpenAI's limit is 8,191)


@dataclass
class EmbeddingsIn:
    input: str | list[Any]  # texts, or token ids (`_inputs`)
    model: str | None = None
    encoding_format: str = "float"
    user: str | None = None
    dimensions: int | None = None


@dataclass
class MemoryPatch:
    add: list[str] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)
    enabled: bool | None = None


class MemoryOut(Struct):
    id: str
    text: str
    source: str
    conversation_id: str | None
    created_at: float
    updated_at: float


class MemoryListOut(Struct):
    object: str
    user_id: str
    enabled: bool
    data: list[MemoryOut]


class MemoryAddedOut(MemoryOut):
    """A fact a PATCH added: `action` says whether it was new or replaced `previous`."""

    action: str
    previous: str | None


class MemoryChangeOut(Struct):
    user_id: str
    enabled: bool
    removed: list[str]
    added: list[MemoryAddedOut]
    data: list[MemoryOut]


class DocumentOut(Struct):
    id: str
    object: str
    name: str
    mime: str
    size_bytes: int
    pages: int | None
    chars: int
    chunks: int
    conversation_id: str | None
    created_at: float

    @classmethod
    def of(cls, d: Document) -> DocumentOut:
        return pick(cls, d, object="document")


class DocumentsOut(Struct):
    object: str
    data: list[DocumentOut]

    @classmethod
    def of(cls, docs: list[Document]) -> DocumentsOut:
        return cls("list", [DocumentOut.of(d) for d in docs])


class PassageOut(Struct):
    chunk_id: int
    document_id: str
    document_name: str
    ord: int
    page: int | None
    text: str

    @classmethod
    def of(cls, c: Chunk) -> PassageOut:
        return pick(cls, c, chunk_id=c.seq)


class CitationOut(PassageOut):
    n: int  # the number the answer cites it by


class CitationsOut(Struct):
    object: str
    turn_id: str
    data: list[CitationOut]


class SearchHitOut(Struct):
    turn_id: str
    conversation_id: str
    title: str | None
    role: str
    match: str
    score: float
    snippet: str
    highlighted: str  # safe HTML: escaped text, matched words in <mark>
    created_at: float
    url: str


class SearchOut(Struct):
    object: str
    query: str
    data: list[SearchHitOut]


class EmbeddingOut(Struct):
    object: str
    index: int
    embedding: list[float] | str  # base64 of little-endian float32 when asked


class EmbeddingUsage(Struct):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsOut(Struct):
    object: str
    model: str
    data: list[EmbeddingOut]
    usage: EmbeddingUsage


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
    ) -> EmbeddingsOut:
        """OpenAI-compatible embeddings (all-MiniLM-L6-v2, 384 dimensions, unit length)."""
        texts = await _inputs(data.input)
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
        return EmbeddingsOut(
            "list",
            EMBEDDING_MODEL,
            [
                EmbeddingOut("embedding", i, _encode(v, data.encoding_format))
                for i, v in enumerate(vectors)
            ],
            EmbeddingUsage(tokens, tokens),
        )

    # -- memory --------------------------------------------------------------------------

    @get("/users/{user_id:str}/memory")
    async def read_memory(
        self, knowledge: KnowledgeDep, user: UserDep, user_id: str
    ) -> MemoryListOut:
        """The facts remembered about the caller (`me`, or one's own id; no one else's)."""
        owner = _memory_owner(user, user_id)
        facts = await knowledge.memory.list(owner.id)
        enabled = await knowledge.memory.enabled(owner.id)
        return MemoryListOut("list", owner.id, enabled, [pick(MemoryOut, m) for m in facts])

    @patch("/users/{user_id:str}/memory")
    async def change_memory(
        self,
        knowledge: KnowledgeDep,
        settings: SettingsDep,
        user: UserDep,
        user_id: str,
        data: MemoryPatch,
    ) -> MemoryChangeOut:
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
        added = [
            pick(MemoryAddedOut, c.memory, action=c.action, previous=c.previous) for c in changes
        ]
        facts = [pick(MemoryOut, m) for m in await memory.list(owner.id)]
        return MemoryChangeOut(owner.id, await memory.enabled(owner.id), removed, added, facts)

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
    ) -> DocumentOut:
        """Upload a file (multipart field `file`) to the library, or to a conversation."""
        return DocumentOut.of(await receive_upload(request, knowledge, user, conversation_id))

    @post(
        "/conversations/{conv_id:str}/documents",
        status_code=HTTP_201_CREATED,
        request_max_body_size=None,
    )
    async def upload_to_conversation(
        self, request: Request[Any, Any, Any], knowledge: KnowledgeDep, user: UserDep, conv_id: str
    ) -> DocumentOut:
        return DocumentOut.of(await receive_upload(request, knowledge, user, conv_id))

    @get("/documents")
    async def list_documents(
        self, knowledge: KnowledgeDep, user: UserDep, conversation_id: str | None = None
    ) -> DocumentsOut:
        return DocumentsOut.of(await knowledge.documents.list(user.id, conversation_id))

    @get("/documents/{doc_id:str}")
    async def read_document(
        self, knowledge: KnowledgeDep, user: UserDep, doc_id: str
    ) -> DocumentOut:
        return DocumentOut.of(await knowledge.documents.get(user.id, doc_id))

    @delete("/documents/{doc_id:str}", status_code=HTTP_204_NO_CONTENT)
    async def delete_document(self, knowledge: KnowledgeDep, user: UserDep, doc_id: str) -> None:
        await knowledge.documents.delete(user.id, doc_id)

    @get("/passages/{chunk_id:int}")
    async def passage(
        self, knowledge: KnowledgeDep, user: UserDep, chunk_id: PositiveId64
    ) -> PassageOut:
        """One document passage (what a citation points at)."""
        return PassageOut.of(await knowledge.documents.passage(user.id, chunk_id))

    @get("/conversations/{conv_id:str}/turns/{turn_id:str}/citations")
    async def citations(
        self, knowledge: KnowledgeDep, user: UserDep, conv_id: str, turn_id: str
    ) -> CitationsOut:
        """The document passages an answer drew on, in the order it was given them."""
        cited = await knowledge.documents.turn_citations(user.id, conv_id, turn_id)
        data = [pick(CitationOut, c, chunk_id=c.seq, n=i + 1) for i, c in enumerate(cited)]
        return CitationsOut("list", turn_id, data)

    # -- search --------------------------------------------------------------------------

    @get("/search")
    async def search(
        self,
        request: AnyRequest,
        knowledge: KnowledgeDep,
        user: UserDep,
        q: str,
        mode: str = Parameter(default="both", pattern="^(words|meaning|both)$"),
        limit: int = Parameter(default=20, ge=1, le=100),
    ) -> SearchOut:
        """Search the conversations one may see by words (all of them) and by meaning (those
        one started)."""
        hits = await knowledge.search.search(user.id, q, mode, limit)
        data = [
            pick(
                SearchHitOut,
                h,
                score=round(h.score, 4),
                snippet=h.snippet.replace(HIT_START, "").replace(HIT_END, ""),
                highlighted=highlight(h.snippet),
                url=at_turn(reverse(request, "conversation", conv_id=h.conversation_id), h.turn_id),
            )
            for h in hits
        ]
        return SearchOut("list", q, data)


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


async def _inputs(raw: str | list[Any]) -> list[str]:
    """The texts to embed: a string, a list of strings, or token ids as OpenAI's API takes
    them (one list of ids, or a list of them), read back as text (knowledge/token_ids.py)."""
    if isinstance(raw, str):
        return [raw]
    shape = (
        f"input must be a string, 1..{MAX_EMBED_INPUTS} strings, a list of token ids or"
        f" 1..{MAX_EMBED_INPUTS} lists of token ids"
    )
    if raw and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        raw = [raw]
    if not raw or len(raw) > MAX_EMBED_INPUTS:
        raise InvalidInput(shape, "input")
    if all(isinstance(t, str) for t in raw):
        return list(raw)
    for i, ids in enumerate(raw):
        if not isinstance(ids, list) or not ids or len(ids) > MAX_TOKEN_IDS:
            raise InvalidInput(f"{shape}; input[{i}] is neither", "input")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise InvalidInput(f"{shape}; input[{i}] is neither", "input")
    try:
        return await token_ids.decode(raw)
    except token_ids.TokenIdsUnreadable as exc:
        raise InvalidInput(str(exc), "input") from exc


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
