"""Documents in the chat UI: attach a file from the composer, see it as a chip, remove it."""

from __future__ import annotations

from litestar import Controller, Response, post

from chatbox.chat import ChatError, InvalidInput
from chatbox.knowledge import EmbeddingUnavailable, KnowledgeError, NotFoundError, RejectedFile
from chatbox.store import Store, User
from chatbox.web.deps import ChatDep, StoreDep, UserDep
from chatbox.web.knowledge import knowledge_of, knowledge_status, receive_upload
from chatbox.web.ui import (
    UI_EXCEPTION_HANDLERS,
    AnyRequest,
    conversation_context,
    html,
    render,
    sidebar,
)


def friendly_knowledge_error(exc: Exception, refused: str = "Not attached") -> tuple[int, str]:
    """Status and a sentence naming the problem (too large, empty, encrypted, not text…)."""
    status, _ = knowledge_status(exc)
    if isinstance(exc, NotFoundError):
        return status, "That conversation or document no longer exists."
    if isinstance(exc, EmbeddingUnavailable):
        return status, "Documents need the embedding model, which is not installed here."
    text = str(exc).strip().rstrip(".") or "the file could not be read"
    if isinstance(exc, RejectedFile):
        text = f"{refused}: {text}"
    return status, text[:1].upper() + text[1:] + "."


def knowledge_ui_error(request: AnyRequest, exc: Exception,
                       refused: str = "Not attached") -> Response[str]:
    """An inline alert for htmx requests (swapped into #alerts); an error page otherwise."""
    status, message = friendly_knowledge_error(exc, refused)
    if request.headers.get("HX-Request") == "true":
        headers = {"HX-Retarget": "#alerts", "HX-Reswap": "innerHTML"}
        return html(request, "_alert.html", status, headers, message=message, status=status)
    return html(request, "error.html", status, message=message, status=status)


async def _chips(request: AnyRequest, store: Store, user: User, conv_id: str) -> Response[str]:
    conv = await store.conversations.get(user.id, conv_id)
    if conv is None:
        raise NotFoundError("conversation not found")
    docs = await store.documents.list(user.id, conv_id)
    return html(request, "_attachments.html", conv=conv, documents=docs)


class AttachmentsController(Controller):
    """`/ui/.../documents`: the composer's attach button and the chips above it."""

    include_in_schema = False
    exception_handlers = {**UI_EXCEPTION_HANDLERS, KnowledgeError: knowledge_ui_error,  # type: ignore[dict-item]
                          EmbeddingUnavailable: knowledge_ui_error}

    @post("/ui/c/{conv_id:str}/documents", status_code=200, request_max_body_size=None)
    async def attach(self, request: AnyRequest, store: StoreDep, user: UserDep,
                     conv_id: str) -> Response[str]:
        """Attach a file (multipart field `file`) to this conversation; answer with the chips."""
        await receive_upload(request, user, conv_id)
        return await _chips(request, store, user, conv_id)

    @post("/ui/new/documents", status_code=200, request_max_body_size=None)
    async def attach_new(self, request: AnyRequest, chat: ChatDep, store: StoreDep,
                         user: UserDep) -> Response[str]:
        """From the new-chat page: start the conversation with the file attached.

        The composer's fields come along (hx-include), so the draft, the model and the
        system prompt survive; a refused file leaves no empty conversation behind.
        """
        form = await request.form()
        model = str(form.get("model") or "").strip() or None
        system_prompt = str(form.get("system_prompt") or "").strip() or None
        if model is not None:
            chat.resolve_model(model)
        if not hasattr(form.get("file"), "filename"):
            raise InvalidInput("choose a file to attach")
        conv = await store.conversations.create(user.id, None, system_prompt, model)
        try:
            await receive_upload(request, user, conv.id)
        except (KnowledgeError, EmbeddingUnavailable, ChatError):
            await store.conversations.delete(user.id, conv.id)
            raise
        view = await chat.view(user, conv.id)
        body = render(request, "_chat.html", draft=str(form.get("content") or ""),
                      **await conversation_context(chat, user, view))
        body += render(request, "_sidebar.html", convs=await sidebar(store, user),
                       conv=view.conversation, oob=True)
        return Response(body, media_type="text/html", headers={"HX-Push-Url": f"/c/{conv.id}"})

    @post("/ui/c/{conv_id:str}/documents/{doc_id:str}/delete", status_code=200)
    async def detach(self, request: AnyRequest, store: StoreDep, user: UserDep, conv_id: str,
                     doc_id: str) -> Response[str]:
        """Remove a document from the conversation (its passages and citations go too)."""
        doc = await store.documents.get(user.id, doc_id)
        if doc is None or doc.conversation_id != conv_id:
            raise NotFoundError("document not found")
        await knowledge_of(request).documents.delete(user.id, doc_id)
        return await _chips(request, store, user, conv_id)
