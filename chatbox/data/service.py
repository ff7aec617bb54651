"""The data service: erasing accounts, retention, zero-data-retention, export and import."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from chatbox.accounts import AuditLog, UserAdmin
from chatbox.accounts.audit import Actor
from chatbox.chat import ChatService
from chatbox.chat.errors import InvalidInput, NotFound
from chatbox.chat.options import TurnOptions
from chatbox.chat.privacy.temporary import TemporaryChat, TemporaryChats, ask, keeps_nothing
from chatbox.chat.prompt import turn_messages
from chatbox.chat.running.runs import TurnRun
from chatbox.data.chatgpt import ImportReport, Limits, parse
from chatbox.data.export import ExportData, Extras, build_zip, read_extras
from chatbox.data.retention import NOTHING, Retention, RetentionReport, Sweeper, keeps
from chatbox.knowledge import Knowledge
from chatbox.knowledge.errors import KnowledgeError
from chatbox.settings import Settings
from chatbox.store import Store, User
from chatbox.store.erasure import Erased, ErasureRepo
from chatbox.store.records import new_id
from chatbox.store.transfer import ImportLost, TransferRepo

log = logging.getLogger("chatbox.data")
RETENTION_HEADER = "x-chatbox-retention"
KvForget = Callable[[str], object]  # drop a conversation's parked KV files (no engine needed)
MAX_IMPORTED_FACTS = 10_000  # memory facts one import restores


@dataclass(frozen=True)
class Imported:
    """An import's outcome: the new conversations, and what came in and what was left out."""

    conversation_ids: list[str]
    report: ImportReport

    def as_dict(self) -> dict[str, Any]:
        return {
            "imported": len(self.conversation_ids),
            "conversation_ids": self.conversation_ids,
            **self.report.as_dict(),
        }


def wants_none(header: str | None) -> bool:
    """Whether a request's X-Chatbox-Retention header asks that nothing be stored."""
    if header is None or header.strip().lower() in ("", "default"):
        return False
    if header.strip().lower() == "none":
        return True
    raise InvalidInput("X-Chatbox-Retention must be 'none' or 'default'", "X-Chatbox-Retention")


def ask_retention(header: str | None, api_key: str | None) -> None:
    """What this request asks of retention (its header, its API key), checked by every path
    that stores content on its behalf."""
    ask(wants_none(header), api_key)


def import_limits(settings: Settings) -> Limits:
    return Limits(
        settings.max_import_bytes,
        settings.max_message_chars,
        settings.max_title_chars,
        settings.max_system_prompt_chars,
    )


async def collect(store: Store, user: User) -> ExportData:
    """Everything of the user's that an export holds: the conversations they started and
    may still see (not those of a workspace they left), their documents and memory, and
    every rating they gave."""
    transfer = TransferRepo(store.db)
    convs = [(c, await transfer.turns(c.id)) for c in await store.conversations.started(user.id)]
    docs = [
        (d, await transfer.chunk_texts(user.id, d.id)) for d in await store.documents.list(user.id)
    ]
    facts = await store.memories.list(user.id)
    feedback = await store.feedback.given_by(user.id)
    return ExportData(user, convs, docs, facts, feedback, await store.responses.of_user(user.id))


async def export_zip(store: Store, user: User) -> bytes:
    """The user's export as zip bytes (compressed off the event loop)."""
    data = await collect(store, user)
    return await asyncio.to_thread(build_zip, data)


async def erase_account(
    store: Store,
    actor: Actor | User | str,
    user: User,
    kv_forget: KvForget | None = None,
    already: Erased | None = None,
    kv_forget_scope: KvForget | None = None,
) -> Erased:
    """Erase everything the account owns; record who did it (the admin, or the user).
    `already`: what was erased of it just before (its conversations, by the chat service).
    `kv_forget_scope` erases the parked KV of everything it sent (stateless completions
    too), for every process on this data directory (a running server never parks it again)."""
    conv_ids = [c.id for c in await TransferRepo(store.db).conversations(user.id)]
    erased = (already or Erased()).add(await ErasureRepo(store.db).account(user.id))
    for conv_id in conv_ids:
        if kv_forget is not None:
            await asyncio.to_thread(kv_forget, conv_id)
    if kv_forget_scope is not None:
        await asyncio.to_thread(kv_forget_scope, user.id)
    await UserAdmin(store, actor).audit.record(
        actor,
        "user.delete",
        user,
        conversations=erased.conversations,
        documents=erased.documents,
        self_service=isinstance(actor, User) and actor.id == user.id,
    )
    return erased


class DataService:
    """What happens to users' data: the rules of this appliance, applied."""

    def __init__(
        self,
        store: Store,
        chat: ChatService,
        settings: Settings,
        kv_forget: KvForget | None = None,
        clock: Callable[[], float] = time.time,
        knowledge: Knowledge | None = None,
        kv_forget_scope: KvForget | None = None,
    ) -> None:
        self.store = store
        self.chat = chat
        self.settings = settings
        self.kv_forget = kv_forget
        self.clock = clock
        self.knowledge = knowledge  # where an export's documents and memory facts go back
        self.kv_forget_scope = kv_forget_scope
        self.transfer = TransferRepo(store.db)
        self.policy = chat.gate.policy
        self.temporary = TemporaryChats(
            chat.models, chat.gate, settings, settings.temporary_chat_idle_s, chat.moderation
        )
        self.retention = Retention(
            ErasureRepo(store.db), self.policy, self._erase, AuditLog(store), clock
        )
        self.sweeper = Sweeper(self.retention, settings.retention_sweep_s, store.jobs)

    def start(self) -> None:
        self.sweeper.start()

    async def stop(self) -> None:
        await self.sweeper.stop()
        await self.temporary.shutdown()

    async def _erase(self, user_id: str, conv_ids: Sequence[str]) -> Erased:
        erased = await self.chat.erase(user_id, conv_ids)
        if self.kv_forget is not None:
            for conv_id in conv_ids:
                await asyncio.to_thread(self.kv_forget, conv_id)
        return erased

    # -- retention and zero-data-retention ------------------------------------------------

    async def run_retention(self, actor: Actor | User, dry_run: bool = False) -> RetentionReport:
        """A retention run an admin asked for (recorded in the audit log)."""
        return await self.retention.run(dry_run, actor)

    def tier_keeps(self, user: User) -> str:
        return keeps(self.policy, user.tier)

    def create_temporary(
        self, user: User, system_prompt: str | None = None, model: str | None = None
    ) -> TemporaryChat:
        """A temporary chat: held in RAM, never written, gone after an idle hour."""
        self.chat.check_temporary(system_prompt, model)
        return self.temporary.create(user, system_prompt, model)

    async def answer_unsaved(
        self, user: User, conv_id: str, content: str, options: TurnOptions
    ) -> TurnRun:
        """An answer in a stored conversation that stores nothing: its history is read,
        the new message and the answer are not written (zero-data-retention request)."""
        conv = await self.chat.conversation(user, conv_id)
        history = turn_messages(await self.store.turns.path(conv.id, conv.active_leaf_id))
        model = self.chat.conversation_model(user, conv)
        if options.model is None and model:
            options = replace(options, model=model)
        return await self.temporary.answer(user, conv.system_prompt, history, content, options)

    async def stores_nothing(self, user: User) -> bool:
        """Zero-data-retention for what this request does for this user: the request's
        header or key, the user's tier, or their own switch."""
        return await keeps_nothing(self.store, self.policy, user)

    async def keeps_nothing(self, user_id: str) -> bool:
        """`stores_nothing` by user id (the knowledge layer's check)."""
        user = await self.store.users.get(user_id)
        return user is not None and await self.stores_nothing(user)

    async def what_is_kept(self, user: User) -> str:
        """What is kept of this user's chats, in words (their own switch, else their tier)."""
        return NOTHING if await self.stores_nothing(user) else self.tier_keeps(user)

    async def refuse_if_stores_nothing(self, user: User, what: str, param: str) -> None:
        """A 422 naming why, for storing `what` under the user's zero-data-retention."""
        if await self.stores_nothing(user):
            raise InvalidInput(
                f"{what} refused: your account stores no content (zero-data-retention)", param
            )

    async def retention_settings(self, user: User) -> dict[str, Any]:
        tier = self.policy.tier(user.tier)
        own = await self.transfer.user_zero_retention(user.id)
        return {
            "tier": user.tier,
            "retention_days": tier.retention_days,
            "tier_zero_retention": tier.zero_retention,
            "zero_retention": own,
            "keeps": await self.what_is_kept(user),
        }

    async def set_zero_retention(self, user: User, on: bool) -> None:
        await self.transfer.set_user_zero_retention(user.id, on)

    # -- accounts ------------------------------------------------------------------------

    async def account(self, name: str) -> User:
        """A live account by name (a deleted one is not found)."""
        user = await self.store.users.get_by_name(name)
        if user is None or name.startswith("deleted:"):
            raise NotFound("user not found")
        return user

    async def delete_account(
        self, actor: Actor | User | str, user: User, confirm: str | None = None
    ) -> Erased:
        """Erase an account. Users deleting their own must type their name as `confirm`."""
        if isinstance(actor, User) and actor.id == user.id and confirm != user.name:
            raise InvalidInput("type your account name to confirm the deletion", "confirm")
        live = await self.store.users.get(user.id)
        if live is None or live.name.startswith("deleted:"):
            raise NotFound("user not found")
        conv_ids = [c.id for c in await self.transfer.conversations(user.id)]
        first = await self._erase(user.id, conv_ids)  # running answers stop, KV goes
        await self.chat.forget_kv_of(user.id)  # its completions' KV, live and parked
        self.chat.forget_answers_of(user.id)  # its cached API answers
        return await erase_account(
            self.store, actor, user, self.kv_forget, first, self.kv_forget_scope
        )

    # -- export and import ---------------------------------------------------------------

    async def export(self, user: User, actor: Actor | User | None = None) -> bytes:
        """The user's data as a zip; an export made by someone else is audit-logged."""
        if actor is not None and not (isinstance(actor, User) and actor.id == user.id):
            await UserAdmin(self.store, actor).audit.record(actor, "user.export", user)
        return await export_zip(self.store, user)

    async def import_chatgpt(self, user: User, data: bytes) -> Imported:
        """Import a ChatGPT conversations.json (or its zip), or a chatbox export (its
        documents and memory facts too): every conversation or none; what a file holds that
        chatbox cannot keep is left out and reported. Refused where nothing may be stored."""
        await self.refuse_if_stores_nothing(user, "import", "file")
        now = self.clock()
        limits = import_limits(self.settings)
        parsed = await asyncio.to_thread(parse, data, limits, now)
        extras = await asyncio.to_thread(read_extras, data, limits.max_bytes)
        if not parsed.conversations and not extras.documents and not extras.facts:
            raise InvalidInput("import refused: the file holds no conversations", "file")
        ids = [new_id("c") for _ in parsed.conversations]
        try:
            await self.transfer.import_conversations(user.id, parsed.conversations, now, ids)
        except BaseException as exc:
            # What was written is hidden; erase it (a crash leaves it to the sweeper).
            await asyncio.shield(self._erase(user.id, ids))
            if isinstance(exc, ImportLost):
                raise InvalidInput(f"import interrupted: {exc}", "file") from exc
            raise
        report = parsed.report
        report.conversations = len(ids)
        report.messages = sum(len(c.turns) for c in parsed.conversations)
        renamed = {src: new for src, new in zip(parsed.source_ids, ids, strict=True) if src}
        await self._restore(user, extras, renamed, report)
        return Imported(ids, report)

    async def _restore(
        self, user: User, extras: Extras, renamed: dict[str, str], report: ImportReport
    ) -> None:
        """An export's documents and memory facts, for this user, through the same services
        (limits, moderation, embedding) as an upload or a remembered fact."""
        if self.knowledge is None:
            for doc in extras.documents:
                report.drop("document", "this server keeps no documents", doc.name)
            for fact in extras.facts:
                report.drop("memory fact", "this server keeps no memory", fact.text[:80])
            return
        for doc in extras.documents:
            conv = renamed.get(doc.conversation_id or "")
            try:
                await self.knowledge.documents.ingest(
                    user.id, conv, doc.name, "text/plain", doc.text.encode()
                )
            except KnowledgeError as exc:
                report.drop("document", str(exc), doc.name)
            else:
                report.documents += 1
        for n, fact in enumerate(extras.facts):
            if n >= MAX_IMPORTED_FACTS:
                report.drop("memory fact", f"over {MAX_IMPORTED_FACTS:,} facts", fact.text[:80])
                continue
            conv = renamed.get(fact.conversation_id or "")
            try:
                changes = await self.knowledge.memory.add(user.id, [fact.text], fact.source, conv)
            except KnowledgeError as exc:
                report.drop("memory fact", str(exc), fact.text[:80])
            else:
                report.memories += len(changes)
