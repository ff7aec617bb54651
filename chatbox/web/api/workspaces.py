"""Team workspaces: the API (admins create and delete, owners manage members, members move
their conversations in and keep the workspace's documents). Its pages: web.ui.workspaces."""

from __future__ import annotations

from dataclasses import dataclass

from litestar import Controller, delete, get, post
from litestar.di import NamedDependency
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT
from msgspec import Struct

from chatbox.accounts import User
from chatbox.chat import ChatService, Conversation, InvalidInput
from chatbox.chat.teams.workspaces import WorkspaceRole, Workspaces
from chatbox.knowledge import Document, Knowledge
from chatbox.web.api.knowledge import DocumentOut, DocumentsOut
from chatbox.web.api.schemas import ConversationOut, pick
from chatbox.web.deps import ChatDep, KnowledgeDep, UserDep
from chatbox.web.ui.helpers import AnyRequest
from chatbox.web.uploads import NOT_MULTIPART, read_upload

WorkspacesDep = NamedDependency[Workspaces]


@dataclass
class NewWorkspace:
    name: str
    system_prompt: str | None = None


@dataclass
class MemberIn:
    name: str
    role: str = "member"


@dataclass
class MoveIn:
    workspace_id: str | None = None  # None: back out of its workspace


class WorkspaceOut(Struct):
    id: str
    name: str
    system_prompt: str | None
    role: str | None  # the caller's
    created_at: float


class WorkspacesOut(Struct):
    data: list[WorkspaceOut]


class MemberOut(Struct):
    user_id: str
    name: str
    role: str
    added_at: float


class WorkspaceViewOut(WorkspaceOut):
    """A workspace with its members and its conversations."""

    members: list[MemberOut]
    conversations: list[ConversationOut]


async def workspace_conversations(chat: ChatService, user: User, ws_id: str) -> list[Conversation]:
    """The workspace's conversations, as one of its members sees them."""
    return [c for c in await chat.conversations(user) if c.workspace_id == ws_id]


async def add_document(
    request: AnyRequest, workspaces: Workspaces, knowledge: Knowledge, user: User, ws_id: str
) -> Document:
    """Read the multipart field `file` into the workspace's library (members only: anyone
    else gets 404 before a byte is read)."""
    ws, _ = await workspaces.get(user, ws_id)
    form = await read_upload(request, knowledge.documents.max_bytes)
    if form.file is None:
        raise InvalidInput(NOT_MULTIPART, "file")
    f = form.file
    return await knowledge.documents.ingest(
        user.id, None, f.filename, f.content_type, f.data, workspace_id=ws.id
    )


class WorkspacesController(Controller):
    path = "/v1/workspaces"
    tags = ["workspaces"]

    @post("/", status_code=HTTP_201_CREATED)
    async def create(
        self, workspaces: WorkspacesDep, user: UserDep, data: NewWorkspace
    ) -> WorkspaceOut:
        """Admins: a new workspace (then add its owners as members with role owner)."""
        return pick(
            WorkspaceOut, await workspaces.create(user, data.name, data.system_prompt), role=None
        )

    @get("/")
    async def list_workspaces(self, workspaces: WorkspacesDep, user: UserDep) -> WorkspacesOut:
        """The workspaces the user belongs to, with their role."""
        return WorkspacesOut(
            [pick(WorkspaceOut, w, role=r) for w, r in await workspaces.mine(user)]
        )

    @get("/{ws_id:str}")
    async def read(
        self, workspaces: WorkspacesDep, chat: ChatDep, user: UserDep, ws_id: str
    ) -> WorkspaceViewOut:
        """A workspace, its members and its conversations (members only)."""
        ws, role = await workspaces.get(user, ws_id)
        convs = await workspace_conversations(chat, user, ws.id)
        return pick(
            WorkspaceViewOut,
            ws,
            role=role,
            members=[pick(MemberOut, m) for m in await workspaces.members(user, ws.id)],
            conversations=[pick(ConversationOut, c) for c in convs],
        )

    @delete("/{ws_id:str}", status_code=HTTP_204_NO_CONTENT)
    async def remove(self, workspaces: WorkspacesDep, user: UserDep, ws_id: str) -> None:
        """Admins: erase the workspace's conversations (as deleting each would), then it."""
        await workspaces.delete(user, ws_id)

    @post("/{ws_id:str}/members", status_code=HTTP_201_CREATED)
    async def add_member(
        self, workspaces: WorkspacesDep, user: UserDep, ws_id: str, data: MemberIn
    ) -> MemberOut:
        """Owners add members (admins also owners)."""
        role: WorkspaceRole = "owner" if data.role == "owner" else "member"
        return pick(MemberOut, await workspaces.add_member(user, ws_id, data.name, role))

    @delete("/{ws_id:str}/members/{user_id:str}", status_code=HTTP_204_NO_CONTENT)
    async def remove_member(
        self, workspaces: WorkspacesDep, user: UserDep, ws_id: str, user_id: str
    ) -> None:
        """Owners remove members; a member leaves with their own id. Access ends at once."""
        await workspaces.remove_member(user, ws_id, user_id)

    @get("/{ws_id:str}/documents")
    async def library(self, workspaces: WorkspacesDep, user: UserDep, ws_id: str) -> DocumentsOut:
        """The workspace's library: what every member's conversations in it may cite."""
        return DocumentsOut.of(await workspaces.library(user, ws_id))

    @post("/{ws_id:str}/documents", status_code=HTTP_201_CREATED, request_max_body_size=None)
    async def upload(
        self,
        request: AnyRequest,
        workspaces: WorkspacesDep,
        knowledge: KnowledgeDep,
        user: UserDep,
        ws_id: str,
    ) -> DocumentOut:
        """Add a file (multipart field `file`) to the workspace's library (members only)."""
        return DocumentOut.of(await add_document(request, workspaces, knowledge, user, ws_id))

    @delete("/{ws_id:str}/documents/{doc_id:str}", status_code=HTTP_204_NO_CONTENT)
    async def delete_document(
        self, workspaces: WorkspacesDep, user: UserDep, ws_id: str, doc_id: str
    ) -> None:
        """Any member deletes one of the workspace's documents."""
        await workspaces.delete_document(user, ws_id, doc_id)


class ConversationWorkspaceController(Controller):
    tags = ["workspaces"]

    @post("/v1/conversations/{conv_id:str}/workspace", status_code=200)
    async def move(
        self, workspaces: WorkspacesDep, user: UserDep, conv_id: str, data: MoveIn
    ) -> ConversationOut:
        """Move one's own conversation into a workspace one belongs to (null: out again)."""
        return pick(ConversationOut, await workspaces.move(user, conv_id, data.workspace_id))
