"""Documents in the chat UI: attach a file from the composer, see it as a chip, remove it."""

from __future__ import annotations

from litestar import Controller, Response, post

from chatbox.accounts import User
from chatbox.chat import ChatService, Conversation, InvalidInput
from chatbox.knowledge import Knowledge, NotFoundError
from chatbox.web.api.knowledge import receive_upload
from chatbox.web.deps import ChatDep, KnowledgeDep, UserDep
from chatbox.web.ui.helpers import (
    UI_EXCEPTION_HANDLERS,
    AnyRequest,
    html,
    start_chat,
)
from chatbox.web.uploads import read_upload


async def _chips(
    request: AnyRequest, chat: ChatService, knowledge: Knowledge, user: User, conv_id: str
) -> Response[str]:
    conv = await chat.conversation(user, conv_id)
    docs = await knowledge.documents.attached(user.id, conv.id)
    return html(request, "_attachments.html", conv=conv, documents=docs)


class AttachmentsController(Controller):
    """`/ui/.../documents`: the composer's attach button and the chips above it."""

    include_in_schema = False
    exception_handlers = UI_EXCEPTION_HANDLERS

    @post(
        "/ui/c/{conv_id:str}/documents", status_code=200, request_max_body_size=None, name="attach"
    )
    async def attach(
        self,
        request: AnyRequest,
        chat: ChatDep,
        knowledge: KnowledgeDep,
        user: UserDep,
        conv_id: str,
    ) -> Response[str]:
        """Attach a file (multipart field `file`) to this conversation; answer with the chips."""
        await receive_upload(request, knowledge, user, conv_id)
        return await _chips(request, chat, knowledge, user, conv_id)

    @post("/ui/new/documents", status_code=200, request_max_body_size=None, name="attach_new")
    async def attach_new(
        self, request: AnyRequest, chat: ChatDep, knowledge: KnowledgeDep, user: UserDep
    ) -> Response[str]:
        """From the new-chat page: start the conversation with the file attached.

        The composer's fields come along (hx-include), so the draft, the model and the
        system prompt survive; a refused file leaves no empty conversation behind.
        """
        # Read (streamed, within the upload cap) before anything is created.
        form = await read_upload(request, knowledge.documents.max_bytes)
        if form.file is None:
            raise InvalidInput("choose a file to attach")

        async def attach(conv: Conversation) -> None:
            await receive_upload(request, knowledge, user, conv.id, form=form)

        fields = form.get("system_prompt"), form.get("model")
        return await start_chat(
            request, chat, knowledge, user, attach, *fields, draft=form.get("content")
        )

    @post("/ui/c/{conv_id:str}/documents/{doc_id:str}/delete", status_code=200, name="detach")
    async def detach(
        self,
        request: AnyRequest,
        chat: ChatDep,
        knowledge: KnowledgeDep,
        user: UserDep,
        conv_id: str,
        doc_id: str,
    ) -> Response[str]:
        """Remove a document from the conversation (its passages and citations go too)."""
        doc = await knowledge.documents.get(user.id, doc_id)
        if doc.conversation_id != conv_id:
            raise NotFoundError("document not found")
        await knowledge.documents.delete(user.id, doc_id)
        return await _chips(request, chat, knowledge, user, conv_id)
