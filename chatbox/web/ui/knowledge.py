"""Knowledge in the web UI: the memory page, sidebar search, and cited passages (htmx)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from litestar import Controller, Response, get, post

from chatbox.chat import NotFound
from chatbox.knowledge import Knowledge
from chatbox.web.api.knowledge import highlight
from chatbox.web.deps import ChatDep, KnowledgeDep, UserDep
from chatbox.web.intake import PositiveId64
from chatbox.web.ui.helpers import FORM, UI_EXCEPTION_HANDLERS, AnyRequest, html, sidebar


@dataclass
class FactForm:
    text: str = ""


@dataclass
class SwitchForm:
    enabled: str = ""


async def _memory_list(
    request: AnyRequest, knowledge: Knowledge, user_id: str, notice: str = ""
) -> Response[str]:
    return html(
        request,
        "_memory_list.html",
        facts=await knowledge.memory.list(user_id),
        enabled=await knowledge.memory.enabled(user_id),
        notice=notice,
    )


class KnowledgePagesController(Controller):
    include_in_schema = False
    exception_handlers = UI_EXCEPTION_HANDLERS

    @get("/memory", name="memory")
    async def memory_page(
        self, request: AnyRequest, chat: ChatDep, knowledge: KnowledgeDep, user: UserDep
    ) -> Response[str]:
        """What chatbox remembers about you: see, edit, delete; switch memory off."""
        return html(
            request,
            "memory.html",
            facts=await knowledge.memory.list(user.id),
            enabled=await knowledge.memory.enabled(user.id),
            notice="",
            **await sidebar(chat, user),
            conv=None,
        )

    @post("/ui/memory/add", status_code=200, name="add_fact")
    async def add_fact(
        self,
        request: AnyRequest,
        knowledge: KnowledgeDep,
        user: UserDep,
        data: Annotated[FactForm, FORM],
    ) -> Response[str]:
        changes = await knowledge.memory.add(user.id, [data.text], "explicit")
        notice = ""
        if changes and changes[0].action != "added":
            notice = f"Updated “{changes[0].previous}”."
        return await _memory_list(request, knowledge, user.id, notice)

    @post("/ui/memory/{fact_id:str}/edit", status_code=200, name="edit_fact")
    async def edit_fact(
        self,
        request: AnyRequest,
        knowledge: KnowledgeDep,
        user: UserDep,
        fact_id: str,
        data: Annotated[FactForm, FORM],
    ) -> Response[str]:
        if await knowledge.memory.edit(user.id, fact_id, data.text) is None:
            raise NotFound("that memory no longer exists")
        return await _memory_list(request, knowledge, user.id, "Saved.")

    @post("/ui/memory/{fact_id:str}/delete", status_code=200, name="delete_fact")
    async def delete_fact(
        self, request: AnyRequest, knowledge: KnowledgeDep, user: UserDep, fact_id: str
    ) -> Response[str]:
        if not await knowledge.memory.remove(user.id, [fact_id]):
            raise NotFound("that memory no longer exists")
        return await _memory_list(request, knowledge, user.id)

    @post("/ui/memory/enabled", status_code=200, name="memory_switch")
    async def switch(
        self,
        request: AnyRequest,
        knowledge: KnowledgeDep,
        user: UserDep,
        data: Annotated[SwitchForm, FORM],
    ) -> Response[str]:
        on = data.enabled in ("on", "true", "1")
        await knowledge.memory.set_enabled(user.id, on)
        return await _memory_list(
            request, knowledge, user.id, "Memory is on." if on else "Memory is off."
        )

    @get("/ui/search", name="search")
    async def search(
        self, request: AnyRequest, knowledge: KnowledgeDep, user: UserDep, q: str = ""
    ) -> Response[str]:
        """Sidebar search results: words and meaning, matched words highlighted."""
        hits = await knowledge.search.search(user.id, q, "both", 20) if q.strip() else []
        # One entry per conversation, in the order of its best hit; each hit keeps its line.
        groups: dict[str, dict[str, Any]] = {}
        for h in hits:
            group = groups.setdefault(
                h.conversation_id, {"id": h.conversation_id, "title": h.title, "hits": []}
            )
            group["hits"].append({"hit": h, "html": highlight(h.snippet)})
        return html(request, "_search_results.html", q=q, groups=list(groups.values()))

    @get("/ui/c/{conv_id:str}/turns/{turn_id:str}/sources", name="sources")
    async def sources(
        self,
        request: AnyRequest,
        knowledge: KnowledgeDep,
        user: UserDep,
        conv_id: str,
        turn_id: str,
    ) -> Response[str]:
        """The passages an answer drew on (empty when none)."""
        cited = await knowledge.documents.turn_citations(user.id, conv_id, turn_id)
        return html(request, "_sources.html", sources=cited)

    @get("/ui/passages/{chunk_id:int}", name="passage")
    async def passage(
        self, request: AnyRequest, knowledge: KnowledgeDep, user: UserDep, chunk_id: PositiveId64
    ) -> Response[str]:
        return html(
            request, "_passage.html", chunk=await knowledge.documents.passage(user.id, chunk_id)
        )
