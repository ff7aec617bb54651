"""The services the command line opens on the database, with no server running: operator
commands (accounts, retention, erasure, export, tools, canaries, the review queue), evals on
the local engines, and copying a box's store into PostgreSQL."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client import CollectorRegistry

from chatbox.accounts import AccountsService
from chatbox.accounts.audit import Actor
from chatbox.chat.admission import Gatekeeper
from chatbox.chat.policy import Policy, default_policy_path
from chatbox.chat.rollout.canary import CanaryService, canary_status
from chatbox.chat.rollout.evaluation import Evaluator
from chatbox.chat.rollout.prewarm import HISTORY_WEEKS, WEEK_H, outlook
from chatbox.chat.routing import Router
from chatbox.chat.teams.workspaces import Workspaces
from chatbox.chat.tools.builtin import catalogue as builtin_catalogue
from chatbox.chat.tools.mcp import tool_name
from chatbox.chat.tools.mcp_servers import McpServers
from chatbox.data.retention import Retention, RetentionReport
from chatbox.data.service import erase_account, export_zip
from chatbox.engine.pool import EnginePool
from chatbox.knowledge import Knowledge
from chatbox.moderation import ModerationPolicy, ModerationService, ReviewQueue
from chatbox.services import check_store_of
from chatbox.services.server import LocalModels, embed_lists, model_registry, serving_files
from chatbox.settings import Settings
from chatbox.store import Store, User, open_database
from chatbox.store.erasure import Erased, ErasureRepo
from chatbox.store.evals import EvalResult, EvalRun
from chatbox.store.migrate import TableCopy, copy_store
from chatbox.store.transfer import TransferRepo


@dataclass
class OperatorServices:
    """The services the command line uses on the database: no engines, no server."""

    settings: Settings
    accounts: AccountsService
    _store: Store

    def workspaces(self, forget: Callable[[str], object] | None = None) -> Workspaces:
        """Team workspaces; `forget` drops an erased conversation's parked KV files."""
        store = self._store

        async def erase(user_id: str, ids: Sequence[str]) -> Erased:
            done = await ErasureRepo(store.db).conversations(user_id, ids)
            if forget is not None:
                for conv_id in ids:
                    forget(conv_id)  # parked KV files of the erased conversations
            return done

        return Workspaces(store, erase)

    async def run_retention(
        self, actor: Actor, dry_run: bool, forget: Callable[[str], object] | None
    ) -> RetentionReport:
        """Erase (or list) conversations past their tier's retention; audited."""
        erasure = ErasureRepo(self._store.db)

        async def erase(user_id: str, ids: Sequence[str]) -> Erased:
            done = await erasure.conversations(user_id, ids)
            if forget is not None:
                for conv_id in ids:
                    forget(conv_id)  # parked KV files of the erased conversations
            return done

        policy = Policy.load(self.settings.policy_path)
        return await Retention(erasure, policy, erase, self.accounts.audit).run(dry_run, actor)

    async def erase_account(
        self,
        actor: Actor,
        user: User,
        forget: Callable[[str], object] | None,
        forget_scope: Callable[[str], object] | None,
    ) -> Erased:
        """Erase an account and everything it owns; audited."""
        return await erase_account(self._store, actor, user, forget, kv_forget_scope=forget_scope)

    async def export_account(self, actor: Actor, user: User) -> bytes:
        """An account's export as zip bytes, recorded in the audit log."""
        await self.accounts.record(actor, "user.export", user)
        return await export_zip(self._store, user)

    async def set_retention(self, actor: Actor, user: User, mode: str) -> None:
        """`none`: the account stores no content; `default`: its tier's. Audited."""
        await TransferRepo(self._store.db).set_user_zero_retention(user.id, mode == "none")
        await self.accounts.record(actor, "user.set_retention", user, retention=mode)

    async def set_key_retention(self, actor: Actor, key_ref: str, mode: str) -> bool:
        """As set_retention for one active API key (by id or prefix); False if there is none."""
        keys = await self._store.keys.list()
        key = next((k for k in keys if key_ref in (k.id, k.prefix)), None)
        if key is None or key.revoked_at is not None:
            return False
        await TransferRepo(self._store.db).set_key_zero_retention(key.id, mode == "none")
        owner = await self._store.users.get(key.user_id)
        await self.accounts.record(actor, "key.set_retention", owner, key_id=key.id, retention=mode)
        return True

    def mcp_servers(self) -> McpServers:
        """The MCP servers' configuration (`chatbox tools`), checked against the policy's tiers."""
        return McpServers(
            self._store, self.accounts.audit, Policy.load(self.settings.policy_path).tiers
        )

    async def tool_catalogue(self, check: bool) -> dict[str, list[dict[str, Any]]]:
        """Every tool the assistant may be offered and where: the built-ins, then each MCP
        server's (its tools listed only where `check` starts it), with its servers."""
        policy = Policy.load(self.settings.policy_path)
        with_tools = [n for n, t in policy.tiers.items() if t.tool_calls > 0]
        with_code = [n for n in with_tools if policy.tiers[n].code_interpreter]
        tools: list[dict[str, Any]] = [
            {
                "name": spec.name,
                "source": "builtin",
                "tiers": with_code if code else with_tools,
                "workspaces": ["all"] if in_workspaces else ["personal chats"],
                "read_only": None,
            }
            for spec, in_workspaces, code in builtin_catalogue()
        ]
        servers = self.mcp_servers()
        try:
            rows = await servers.overview()
            if check:
                rows = [await servers.check(r["name"]) for r in rows]
        finally:
            await servers.close()
        for row in rows:
            tiers = [t for t in with_tools if not row["tiers"] or t in row["tiers"]]
            where = row["workspaces"] or ["all"]
            listed = row["tools"] if check else []
            for tool in listed:
                tools.append(
                    {
                        "name": tool_name(row["name"], tool["name"]),
                        "source": f"mcp:{row['name']}",
                        "tiers": tiers,
                        "workspaces": where,
                        "read_only": tool["read_only"],
                    }
                )
            if not listed:  # not started: its tools are not known, its marks are
                tools.append(
                    {
                        "name": f"{row['name']}__*",
                        "source": f"mcp:{row['name']}",
                        "tiers": tiers,
                        "workspaces": where,
                        "read_only": None,
                        "marked_read_only": row["read_only"],
                    }
                )
        return {"tools": tools, "servers": rows}

    def canaries(self) -> CanaryService:
        """Canary decisions on the database: a running server applies them at its next
        check (within CHECK_EVERY_S); verdicts are the server's newest stored ones."""
        return CanaryService(
            self._store, Policy.load(self.settings.policy_path), self.accounts.audit
        )

    async def canary_status(self) -> list[dict[str, Any]]:
        return await canary_status(self._store, Policy.load(self.settings.policy_path))

    async def installed_models(self) -> set[str]:
        """The models this data directory's registry holds and router mode's replicas name."""
        names = set(model_registry(self.settings).names())
        for replica in await self._store.replicas.list():
            names.update(replica.models)
        return names

    async def pin_model(self, actor: Actor, model: str, pin: bool = True) -> bool:
        """Pin `model` warm (or unpin it), audited; False where nothing changed. Every
        server on this database reads the pins at its pre-warmer's next step."""
        if pin and model not in (installed := await self.installed_models()):
            names = ", ".join(sorted(installed)) or "none"
            raise ValueError(f"model {model!r} is not installed (installed: {names})")
        pins = self._store.pins
        changed = await (pins.pin(model, actor.name) if pin else pins.unpin(model))
        if changed:
            action = "prewarm.pin" if pin else "prewarm.unpin"
            await self.accounts.audit.record(actor, action, None, model=model)
        return changed

    async def prewarm_outlook(self) -> dict[str, Any]:
        now = time.time()
        since = int(now // 3600) - HISTORY_WEEKS * WEEK_H
        pins = [(p.model, p.actor_name, p.at) for p in await self._store.pins.all()]
        return outlook(await self._store.usage.hourly(since), pins, now)

    async def eval_runs(self, model: str | None, limit: int) -> list[EvalRun]:
        return await self._store.evals.runs(model, limit)

    async def eval_run(self, run_id: str) -> tuple[EvalRun, list[EvalResult]] | None:
        run = await self._store.evals.run(run_id)
        return None if run is None else (run, await self._store.evals.results(run_id))

    def review_queue(self) -> ReviewQueue:
        """The moderation review queue under the configured (or shipped) policy."""
        path = self.settings.policy_path or default_policy_path()
        return ReviewQueue(self._store, ModerationPolicy.load(path))


@asynccontextmanager
async def operator_services(settings: Settings) -> AsyncIterator[OperatorServices]:
    """Open the database (creating the first admin on an empty one) for the command line."""
    settings.ensure_dirs()
    check_store_of(settings)
    store = await Store.open(settings.database)
    try:
        accounts = AccountsService(store, settings)
        await accounts.ensure_admin()
        yield OperatorServices(settings, accounts, store)
    finally:
        await store.close()


async def migrate_store(settings: Settings, url: str) -> list[TableCopy]:
    """Copy this box's SQLite store into the empty PostgreSQL database at `url` (migrated
    first); each table's counts and checksums on both sides."""
    source = await open_database(settings.db_path)
    try:
        target = await open_database(url)
        try:
            return await copy_store(source, target)
        finally:
            await target.close()
    finally:
        await source.close()


@dataclass
class EvalServices:
    """What `chatbox eval run` needs: the local engines, admission and moderation as the
    server has them, the embedding model, and the store (no server, no background work)."""

    evals: Evaluator
    accounts: AccountsService
    store: Store
    models: LocalModels

    async def admin(self, name: str | None) -> User:
        """The account evals run as: `name`, else the first admin."""
        if name:
            user = await self.store.users.get_by_name(name)
            if user is None:
                raise LookupError(f"no user named {name!r}")
            return user
        admins = [u for u in await self.store.users.list() if u.role == "admin"]
        if not admins:
            raise LookupError("no admin account to run evals as (name one with --as)")
        return admins[0]


@asynccontextmanager
async def evaluation_services(settings: Settings) -> AsyncIterator[EvalServices]:
    """Engines, admission and moderation over the database, for the command line's evals."""
    settings.ensure_dirs()
    registry = model_registry(settings)
    check_store_of(settings)
    store = await Store.open(settings.database)
    metrics = CollectorRegistry()
    pool = None
    knowledge = None
    loading: asyncio.Task[None] | None = None
    try:
        accounts = AccountsService(store, settings)
        await accounts.ensure_admin()

        # No KV is parked: eval answers are no one's conversation.
        pool = EnginePool(
            serving_files(settings, registry), replace(settings.engine, kv_dir=None), metrics
        )
        local = LocalModels(registry, pool, settings)
        policy = Policy.load(settings.policy_path)
        gate = Gatekeeper(
            policy,
            store.usage,
            Router(policy, local.names, local.default),
            local.stats,
            settings.high_water,
        )
        knowledge = Knowledge(store, settings, lambda: local.engine(local.default()))
        moderation = ModerationService(
            store,
            ModerationPolicy.load(settings.policy_path or default_policy_path()),
            knowledge.embedder,
            settings.cache_dir,
            metrics,
        )
        loading = moderation.start()
        evals = Evaluator(store, local, gate, moderation, accounts.audit, embed_lists(knowledge))
        yield EvalServices(evals, accounts, store, local)
    finally:
        if loading is not None:  # a run that ended early must not leave it loading past here
            loading.cancel()
            await asyncio.gather(loading, return_exceptions=True)
        if pool is not None:
            await pool.stop_all()
        if knowledge is not None:
            await knowledge.shutdown()
        await store.close()
