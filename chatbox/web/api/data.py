"""Users' data over HTTP: export, import, account deletion, retention settings, and the
admin's side of them (deleting or exporting an account, a retention run)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from litestar import Controller, Response, delete, get, patch, post
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT
from msgspec import Struct, convert

from chatbox.chat import InvalidInput
from chatbox.chat.privacy.temporary import TemporaryChat
from chatbox.web.api.schemas import pick
from chatbox.web.auth import AnyRequest
from chatbox.web.console.usage import require_admin
from chatbox.web.deps import DataServiceDep, SettingsDep, UserDep
from chatbox.web.intake import NonEmptyText
from chatbox.web.uploads import read_upload


@dataclass
class DeleteMe:
    confirm: NonEmptyText  # the account's name, typed again


@dataclass
class RetentionPatch:
    zero_retention: bool


class TemporaryMessageOut(Struct):
    role: str
    content: str


class TemporaryChatOut(Struct):
    """A temporary chat as the conversation API shows it (its messages are in RAM only)."""

    id: str
    temporary: bool
    title: None
    system_prompt: str | None
    model: str | None
    created_at: float
    updated_at: float
    messages: list[TemporaryMessageOut]

    @classmethod
    def of(cls, chat: TemporaryChat) -> TemporaryChatOut:
        messages = [TemporaryMessageOut(m.role, m.content) for m in chat.messages]
        return pick(
            cls, chat, temporary=True, title=None, updated_at=chat.touched, messages=messages
        )


class DroppedOut(Struct, forbid_unknown_fields=True):
    """Something an import left out: its kind, why, how many, and a few examples."""

    kind: str
    reason: str
    count: int
    examples: list[str]


class ImportOut(Struct, forbid_unknown_fields=True):
    imported: int
    conversation_ids: list[str]
    conversations: int
    messages: int
    documents: int
    memories: int
    dropped: list[DroppedOut]


class RetentionOut(Struct, forbid_unknown_fields=True):
    """What is kept of one's data, and for how long."""

    tier: str
    retention_days: int
    tier_zero_retention: bool
    zero_retention: bool
    keeps: str


class ExpiredOut(Struct, forbid_unknown_fields=True):
    conversation_id: str
    user: str
    tier: str
    retention_days: int
    last_active: float


class ErasedOut(Struct, forbid_unknown_fields=True):
    conversations: int
    turns: int
    documents: int
    memories: int


class RetentionRunOut(Struct, forbid_unknown_fields=True):
    """What a retention run erased (or, dry_run, would erase)."""

    dry_run: bool
    expired: list[ExpiredOut]
    unfinished_deletions: int
    erased: ErasedOut


def zip_response(body: bytes, name: str) -> Response[bytes]:
    stamp = time.strftime("%Y%m%d", time.gmtime())
    return Response(
        body,
        media_type="application/zip",
        headers={
            "Content-Disposition": f'attachment; filename="chatbox-{name}-{stamp}.zip"',
            "Cache-Control": "no-store",
        },
    )


class DataController(Controller):
    path = "/v1"
    tags = ["data"]

    @get("/users/me/export", media_type="application/zip", name="data_export")
    async def export(self, data_service: DataServiceDep, user: UserDep) -> Response[bytes]:
        """All of one's data as a zip: conversations.json (ChatGPT's export shape), a
        Markdown file per conversation with every branch, documents, memory facts."""
        return zip_response(await data_service.export(user), user.name)

    @post("/users/me/import", status_code=HTTP_201_CREATED, request_max_body_size=None)
    async def import_chatgpt(
        self,
        request: AnyRequest,
        data_service: DataServiceDep,
        settings: SettingsDep,
        user: UserDep,
    ) -> ImportOut:
        """Import a ChatGPT export (multipart field `file`: conversations.json or the zip) or
        a chatbox export zip (its documents and memory facts too). The answer counts what came
        in (`imported` conversations, `messages`, `documents`, `memories`) and lists what was
        left out (`dropped`: kind, reason, count and a few examples each)."""
        form = await read_upload(request, settings.max_import_bytes)
        if form.file is None:
            raise InvalidInput("send the export as multipart/form-data in a field named 'file'")
        done = await data_service.import_chatgpt(user, form.file.data)
        return convert(done.as_dict(), ImportOut)

    @get("/users/me/retention")
    async def retention(self, data_service: DataServiceDep, user: UserDep) -> RetentionOut:
        """What is kept of one's data, and for how long."""
        return convert(await data_service.retention_settings(user), RetentionOut)

    @patch("/users/me/retention")
    async def set_retention(
        self, data_service: DataServiceDep, user: UserDep, data: RetentionPatch
    ) -> RetentionOut:
        """Switch zero-data-retention on (every chat temporary) or off for oneself."""
        await data_service.set_zero_retention(user, data.zero_retention)
        return convert(await data_service.retention_settings(user), RetentionOut)

    @post("/users/me/delete", status_code=HTTP_204_NO_CONTENT)
    async def delete_me(self, data_service: DataServiceDep, user: UserDep, data: DeleteMe) -> None:
        """Erase one's own account and everything it holds (`confirm`: the account name)."""
        await data_service.delete_account(user, user, data.confirm)

    # -- admins ---------------------------------------------------------------------------

    @delete("/admin/users/{name:str}", status_code=HTTP_204_NO_CONTENT)
    async def admin_delete(self, data_service: DataServiceDep, user: UserDep, name: str) -> None:
        """Erase an account (admins only; recorded in the audit log)."""
        require_admin(user)
        target = await data_service.account(name)
        if target.id == user.id:
            raise InvalidInput("delete your own account from your settings page", "name")
        await data_service.delete_account(user, target)

    @post("/admin/retention/run", status_code=200)
    async def retention_run(
        self,
        data_service: DataServiceDep,
        user: UserDep,
        dry_run: bool = False,
    ) -> RetentionRunOut:
        """Erase conversations past their tier's retention now (or list them: dry_run)."""
        require_admin(user)
        return convert((await data_service.run_retention(user, dry_run)).as_dict(), RetentionRunOut)
