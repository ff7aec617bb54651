"""Team workspaces: admins create them and name owners; owners add and remove members; a
conversation moved into one is read and continued by every member.

Who sees and changes a conversation is decided in one place (`chatbox.chat.teams.access`, over the
store's `visible_to`); this service decides who may manage a workspace, and records each change
of one in the audit log (whoever made it: an admin or an owner through the API or the console,
the operator through the CLI). Anyone outside a workspace is told it does not exist.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from chatbox.accounts import AuditLog
from chatbox.accounts.audit import Actor
from chatbox.chat.errors import Forbidden, InvalidInput, NotFound
from chatbox.chat.teams.access import conversation_for
from chatbox.store import Conversation, Document, Store, User
from chatbox.store.erasure import Erased, ErasureRepo
from chatbox.store.workspaces import Member, Workspace, WorkspaceRole

__all__ = [
    "MAX_NAME_CHARS",
    "Member",
    "Workspace",
    "WorkspaceRole",
    "Workspaces",
    "prompt_scope",
    "valid_name",
]

MAX_NAME_CHARS = 80
Erase = Callable[[str, Sequence[str]], Awaitable[Erased]]


async def prompt_scope(store: Store, conv: Conversation) -> tuple[str | None, int, str]:
    """A turn's system prompt, how many leading messages are configured (not typed by a
    user, so their KV may be shared), and its cache scope (the user, or the workspace)."""
    if conv.workspace_id is None:
        return conv.system_prompt, 0, conv.user_id
    ws = await store.workspaces.get(conv.workspace_id)
    configured = ws.system_prompt if ws is not None else None
    scope = f"ws:{conv.workspace_id}"
    if configured and conv.system_prompt:
        # One system message: only a whole message can be shared, and this one holds both.
        return f"{configured}\n\n{conv.system_prompt}", 0, scope
    if configured:
        return configured, 1, scope
    return conv.system_prompt, 0, scope


def valid_name(name: str) -> str:
    """A workspace's name, trimmed; InvalidInput unless 1 to MAX_NAME_CHARS characters."""
    name = name.strip()
    if not name or len(name) > MAX_NAME_CHARS:
        raise InvalidInput(f"a workspace name is 1 to {MAX_NAME_CHARS} characters", "name")
    return name


@dataclass
class Workspaces:
    store: Store
    erase: Erase  # ChatService.erase: stops answers, erases content and KV

    async def create(
        self, admin: User, name: str, system_prompt: str | None = None, owner: str | None = None
    ) -> Workspace:
        """A new workspace; with `owner` (a user's name, checked first, so a wrong name
        creates nothing) that user is its first owner."""
        self._admin(admin)
        return await self.operator_create(admin, name, system_prompt, [owner] if owner else [])

    async def operator_create(
        self,
        actor: Actor | User,
        name: str,
        system_prompt: str | None = None,
        owners: Sequence[str] = (),
    ) -> Workspace:
        """`create` for one already known to be an admin (the CLI's operator)."""
        name = valid_name(name)
        if await self.store.workspaces.get(name) is not None:
            raise InvalidInput(f"a workspace named {name!r} exists", "name")
        people = [await self._person(o, "owner") for o in owners]  # all known before any change
        ws = await self.store.workspaces.create(name, system_prompt or None)
        await self._audit(actor, "workspace.create", None, workspace=ws.id, name=ws.name)
        for person in people:
            await self.store.workspaces.set_member(ws.id, person.id, "owner")
            await self._audit(actor, "workspace.add_member", person, workspace=ws.id, role="owner")
        return ws

    async def all(self, admin: User) -> list[Workspace]:
        self._admin(admin)
        return await self.store.workspaces.list()

    async def overview(self, admin: User) -> list[tuple[Workspace, list[Member]]]:
        """Every workspace with its members (the console): who, not what is in it."""
        self._admin(admin)
        return [(ws, await self.store.workspaces.members(ws.id)) for ws in await self.all(admin)]

    async def mine(self, user: User) -> list[tuple[Workspace, WorkspaceRole]]:
        """The workspaces the user belongs to, with their role in each."""
        out = []
        for ws in await self.store.workspaces.list(user.id):
            role = await self.store.workspaces.role(ws.id, user.id)
            if role is not None:
                out.append((ws, role))
        return out

    async def get(
        self, user: User, ws_id: str, *, manage: bool = False
    ) -> tuple[Workspace, WorkspaceRole | None]:
        """A workspace the user belongs to; else 404. An admin who is not a member reaches
        one (role None) only to manage it: its content stays closed ("usage, not content")."""
        ws = await self.store.workspaces.get(ws_id)
        role = await self.store.workspaces.role(ws.id, user.id) if ws else None
        if ws is None or (role is None and not (manage and user.role == "admin")):
            raise NotFound("workspace not found")
        return ws, role

    async def members(self, user: User, ws_id: str, *, manage: bool = False) -> list[Member]:
        """Who is in it (members; an admin also, to manage it: `manage`)."""
        ws, _ = await self.get(user, ws_id, manage=manage)
        return await self.store.workspaces.members(ws.id)

    async def add_member(
        self, user: User, ws_id: str, name: str, role: WorkspaceRole = "member"
    ) -> Member:
        """Owners add members; only an admin makes an owner."""
        ws = await self._managed(user, ws_id)
        if role not in ("owner", "member"):
            raise InvalidInput("role is owner or member", "role")
        if role == "owner" and user.role != "admin":
            raise Forbidden("only an admin assigns owners")
        return await self._set_member(user, ws, name, role)

    async def operator_set_member(
        self, actor: Actor | User, ws_ref: str, name: str, role: WorkspaceRole
    ) -> Member:
        """Add a member or owner (or change their role) as the operator (the CLI)."""
        ws = await self.store.workspaces.get(ws_ref)
        if ws is None:
            raise NotFound("workspace not found")
        return await self._set_member(actor, ws, name, role)

    async def _set_member(
        self, actor: Actor | User, ws: Workspace, name: str, role: WorkspaceRole
    ) -> Member:
        person = await self._person(name)
        await self.store.workspaces.set_member(ws.id, person.id, role)
        await self._audit(actor, "workspace.add_member", person, workspace=ws.id, role=role)
        return next(m for m in await self.store.workspaces.members(ws.id) if m.user_id == person.id)

    async def remove_member(self, user: User, ws_id: str, user_id: str) -> None:
        """Owners remove members (an admin also owners); a member may remove themself."""
        ws, role = await self.get(user, ws_id, manage=True)
        target = await self.store.workspaces.role(ws.id, user_id)
        if target is None:
            raise NotFound("not a member")
        leaving = user_id == user.id and role == "member"
        if not leaving:
            await self._managed(user, ws.id)
            if target == "owner" and user.role != "admin":
                raise Forbidden("only an admin removes an owner")
        await self._remove(user, ws, user_id)

    async def operator_find(self, ws_ref: str) -> Workspace:
        """A workspace by name or id, as the operator (the CLI) names it; NotFound if none."""
        ws = await self.store.workspaces.get(ws_ref)
        if ws is None:
            raise NotFound("workspace not found")
        return ws

    async def operator_overview(self) -> list[tuple[Workspace, list[Member]]]:
        """Every workspace with its members, as the operator (the CLI) sees them."""
        found = await self.store.workspaces.list()
        return [(ws, await self.store.workspaces.members(ws.id)) for ws in found]

    async def operator_remove_member(self, actor: Actor | User, ws_ref: str, name: str) -> None:
        """Remove a member as the operator (the CLI); NotFound unless they are one."""
        ws = await self.store.workspaces.get(ws_ref)
        person = await self.store.users.get_by_name(name.strip())
        if ws is None or person is None:
            raise NotFound("not a member")
        if not await self._remove(actor, ws, person.id):
            raise NotFound("not a member")

    async def _remove(self, actor: Actor | User, ws: Workspace, user_id: str) -> bool:
        if not await self.store.workspaces.remove_member(ws.id, user_id):
            return False
        await self._audit(
            actor, "workspace.remove_member", await self.store.users.get(user_id), workspace=ws.id
        )
        return True

    async def move(self, user: User, conv_id: str, ws_id: str | None) -> Conversation:
        """Move the user's own conversation into a workspace they belong to (None: out)."""
        conv = await conversation_for(self.store, user.id, conv_id, "own")
        if ws_id is not None:
            ws, role = await self.get(user, ws_id)
            if role is None:
                raise NotFound("workspace not found")
            ws_id = ws.id
        await self.store.workspaces.move(user.id, conv.id, ws_id)
        return await conversation_for(self.store, user.id, conv.id)

    async def delete(self, admin: User, ws_id: str) -> Erased:
        """Erase every conversation of the workspace (as deleting each would), then it."""
        if admin.role != "admin":
            await self.get(admin, ws_id)  # a non-member learns nothing: 404, not 403
        self._admin(admin)
        return await self.erase_workspace(ws_id, admin)

    async def erase_workspace(self, ws_id: str, actor: Actor | User) -> Erased:
        """Erase its conversations and documents, then drop it (also the CLI's, as the
        operator)."""
        ws = await self.store.workspaces.get(ws_id)
        if ws is None:
            raise NotFound("workspace not found")
        convs, _ = await self.store.workspaces.contents(ws.id)
        erased = Erased()
        by_owner: dict[str, list[str]] = {}
        for owner, conv_id in convs:
            by_owner.setdefault(owner, []).append(conv_id)
        for owner, ids in by_owner.items():
            erased.add(await self.erase(owner, ids))
        erased.add(await ErasureRepo(self.store.db).workspace(ws.id))
        await self._audit(
            actor,
            "workspace.delete",
            None,
            workspace=ws.id,
            name=ws.name,
            conversations=erased.conversations,
            documents=erased.documents,
        )
        return erased

    async def library(self, user: User, ws_id: str) -> list[Document]:
        """The workspace's documents (members only), newest first."""
        ws, _ = await self.get(user, ws_id)
        return await self.store.documents.of_workspace(ws.id)

    async def delete_document(self, user: User, ws_id: str, doc_id: str) -> None:
        """Any member deletes a document of the workspace (its passages and citations go)."""
        ws, _ = await self.get(user, ws_id)
        doc = await self.store.documents.get(user.id, doc_id)
        if doc is None or doc.workspace_id != ws.id:
            raise NotFound("document not found")
        await self.store.documents.delete(user.id, doc.id)

    async def _audit(
        self, actor: Actor | User, action: str, target: User | None, **detail: object
    ) -> None:
        await AuditLog(self.store).record(actor, action, target, **detail)

    async def _person(self, name: str, field: str = "name") -> User:
        person = await self.store.users.get_by_name(name.strip())
        if person is None or person.disabled:
            raise InvalidInput(f"no user named {name!r}", field)
        return person

    async def _managed(self, user: User, ws_id: str) -> Workspace:
        ws, role = await self.get(user, ws_id, manage=True)
        if role != "owner" and user.role != "admin":
            raise Forbidden("only the workspace's owners manage its members")
        return ws

    @staticmethod
    def _admin(user: User) -> None:
        if user.role != "admin":
            raise Forbidden("only an admin manages workspaces")
