"""The library page: documents kept for every conversation (upload, list, delete; htmx).

A library document has no conversation; retrieval in each of the user's conversations draws
on it. Uploads go through the same path as a conversation attachment (`receive_upload`), so
the accepted types, the limits and the friendly errors are the same, and a refused file
stores nothing.
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, Response, get, post
from litestar.types import ExceptionHandlersMap

from chatbox.accounts import User
from chatbox.knowledge import Document, Knowledge, NotFoundError
from chatbox.web.api.knowledge import receive_upload
from chatbox.web.deps import ChatDep, KnowledgeDep, UserDep
from chatbox.web.ui.helpers import UI_EXCEPTION_HANDLERS, AnyRequest, html, sidebar, ui_error


def library_ui_error(request: AnyRequest, exc: Exception) -> Response[str]:
    """The attachment path's alert, worded for the library."""
    return ui_error(request, exc, "Not added to your library")


def size_label(n: int) -> str:
    """Bytes as a person reads them: 812 bytes, 4.2 KB, 1.3 MB."""
    if n < 1000:
        return f"{n} byte{'s' if n != 1 else ''}"
    if n < 1000 * 1000:
        return f"{n / 1000:.1f} KB"
    return f"{n / 1000 / 1000:.1f} MB"


def document_row(d: Document) -> dict[str, Any]:
    """What the library list shows of a document."""
    return {
        "id": d.id,
        "name": d.name,
        "size": size_label(d.size_bytes),
        "pages": d.pages,
        "chunks": d.chunks,
        "chars": d.chars,
        "uploaded_at": d.created_at,  # shown in the reader's zone (the `when` filter)
    }


async def _rows(knowledge: Knowledge, user: User) -> list[dict[str, Any]]:
    return [document_row(d) for d in await knowledge.documents.list(user.id, library=True)]


async def _library_list(
    request: AnyRequest, knowledge: Knowledge, user: User, notice: str = ""
) -> Response[str]:
    return html(
        request, "_library_list.html", documents=await _rows(knowledge, user), notice=notice
    )


class LibraryController(Controller):
    """`/library` and its htmx partials under `/ui/library/`."""

    include_in_schema = False
    exception_handlers: ExceptionHandlersMap = {
        cls: library_ui_error for cls in UI_EXCEPTION_HANDLERS
    }

    @get("/library", name="library")
    async def library_page(
        self, request: AnyRequest, chat: ChatDep, knowledge: KnowledgeDep, user: UserDep
    ) -> Response[str]:
        """Your library: documents every conversation can draw on."""
        return html(
            request,
            "library.html",
            documents=await _rows(knowledge, user),
            notice="",
            **await sidebar(chat, user),
            conv=None,
        )

    @post("/ui/library/documents", status_code=200, request_max_body_size=None, name="upload")
    async def upload(
        self, request: AnyRequest, knowledge: KnowledgeDep, user: UserDep
    ) -> Response[str]:
        """Add a file (multipart field `file`) to the library; answer with the list."""
        doc = await receive_upload(request, knowledge, user, None, library=True)
        return await _library_list(request, knowledge, user, f"Added {doc.name}.")

    @post("/ui/library/documents/{doc_id:str}/delete", status_code=200, name="remove")
    async def remove(
        self, request: AnyRequest, knowledge: KnowledgeDep, user: UserDep, doc_id: str
    ) -> Response[str]:
        """Delete a library document (its passages and citations go too)."""
        doc = await knowledge.documents.get(user.id, doc_id)
        if doc.conversation_id is not None:
            raise NotFoundError("document not found")
        await knowledge.documents.delete(user.id, doc_id)
        return await _library_list(request, knowledge, user, f"Deleted {doc.name}.")
