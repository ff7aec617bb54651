"""ReplicaAdmin: the replica table (the database) and the live fleet, kept in step.

Replicas named on the command line or in CHATBOX_REPLICAS live only in the running front;
those added with `chatbox replicas add` (this service, through the admin API) are kept in
the database and come back on the next start. A drain is kept in the database by URL, for
either kind. On PostgreSQL every front reloads the table and the drains with each round of
health checks, so a change made on one front reaches every front on the same database, and
the fronts share where keys were placed and their answers on OpenAI-kind replicas. Every
change is recorded in the audit log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from chatbox.accounts import User
from chatbox.accounts.audit import Actor, AuditLog
from chatbox.cluster.fleet import Fleet
from chatbox.cluster.local import LOCAL
from chatbox.cluster.protocol import ReplicaSpec
from chatbox.store.replicas import ReplicaRepo, ReplicaRow

log = logging.getLogger("chatbox.cluster")
PLACEMENT_TTL_S = 7 * 86400.0  # a placement not renewed for a week is dropped
PRUNE_EVERY_S = 3600.0
LOAD_FRESH_S = 3  # another front's published load counts for this many health rounds


def _spec(row: ReplicaRow) -> ReplicaSpec:
    return ReplicaSpec(row.url, row.kind, row.slots, row.models, row.secret)


class UnknownReplica(LookupError):
    """No replica has that URL."""


class ReplicaAdmin:
    def __init__(self, table: ReplicaRepo, fleet: Fleet, audit: AuditLog) -> None:
        self.table = table
        self.fleet = fleet
        self.audit = audit
        self._rows: dict[str, ReplicaSpec] = {}  # the table as this front last loaded it
        self._task: asyncio.Task[None] | None = None
        self._pruned = 0.0
        self._lock = asyncio.Lock()  # a reload never undoes a change made while it read

    async def start(self, flags: tuple[str, ...]) -> None:
        """Load the table and the flag replicas, check them once, then keep checking."""
        for text in flags:
            self.fleet.add(ReplicaSpec.parse(text), "flag")
        await self.sync(check=False)
        await self.fleet.check_all()  # routing works from the first request
        self.fleet.start()
        if self.table.db.dialect == "postgresql":  # several fronts may share the database
            self.fleet.placements = self.table
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.fleet.stop()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.fleet.health_s)
            try:
                await self.sync()
            except Exception as exc:  # the database may be briefly away: the fleet goes on
                log.warning("could not reload the replica table: %s", exc)

    async def sync(self, check: bool = True) -> None:
        """Bring the fleet in step with the table and the drains (another front may have
        changed them), and share this front's load on OpenAI-kind replicas."""
        async with self._lock:
            await self._sync(check)

    async def _sync(self, check: bool) -> None:
        rows = {row.url: _spec(row) for row in await self.table.list()}
        drains = await self.table.drains()
        for url, spec in rows.items():
            member = self.fleet.members.get(url)
            if member is None or (member.source != LOCAL and self._rows.get(url) != spec):
                member = self.fleet.add(spec, "table")
                if check:
                    await self.fleet.check(member)
        for url in [u for u, m in self.fleet.members.items() if m.source == "table"]:
            if url not in rows:
                await self.fleet.remove(url)
        self._rows = rows
        for url, member in self.fleet.members.items():
            if url != LOCAL:  # this front's own engine drains on this front only
                member.draining = url in drains
        await self._share_loads()
        if time.monotonic() - self._pruned > PRUNE_EVERY_S:
            self._pruned = time.monotonic()
            await self.table.forget_placements(PLACEMENT_TTL_S)

    async def _share_loads(self) -> None:
        """OpenAI-kind replicas report no load: the fronts add up their own counts."""
        openai = [m for m in self.fleet.members.values() if m.spec.kind == "openai"]
        if not openai:
            return
        mine = {(m.url, model): n for m in openai for model, n in m.inflight.items()}
        others = await self.table.share_loads(mine, LOAD_FRESH_S * self.fleet.health_s)
        for member in openai:
            member.others = {model: n for (url, model), n in others.items() if url == member.url}

    def list(self) -> list[dict[str, Any]]:
        return [m.view() for m in self.fleet.members.values()]

    async def add(
        self,
        actor: Actor | User,
        url: str,
        kind: str = "chatbox",
        slots: int = 0,
        models: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        """Add (or re-point) a replica; ValueError for a malformed one."""
        spec = ReplicaSpec.parse(url if "+" in url.split("://", 1)[0] else f"{kind}+{url}")
        spec = ReplicaSpec(spec.url, spec.kind, slots or spec.slots, models or spec.models)
        async with self._lock:
            await self.table.upsert(spec.url, spec.kind, spec.slots, spec.models)
            member = self.fleet.add(spec, "table")
            self._rows[spec.url] = spec
        await self.fleet.check(member)
        view = member.view()
        await self.audit.record(actor, "replica.add", url=view["url"], kind=view["kind"])
        return view

    async def remove(self, actor: Actor | User, url: str) -> None:
        """Remove a replica; answers running there finish first (they hold their stream)."""
        given = url
        url = url.rstrip("/")
        async with self._lock:
            in_table = await self.table.remove(url)
            self._rows.pop(url, None)
            removed = await self.fleet.remove(url)
        if not removed and not in_table:
            raise UnknownReplica(url)
        await self.audit.record(actor, "replica.remove", url=given)

    async def drain(self, actor: Actor | User, url: str, draining: bool = True) -> dict[str, Any]:
        """Stop (or resume) new work on a replica; running answers finish there."""
        url = url.rstrip("/")
        member = self.fleet.members.get(url)
        if member is None:
            raise UnknownReplica(url)
        async with self._lock:
            member.draining = draining
            if url != LOCAL:
                await self.table.set_draining(url, draining)
        view = member.view()
        await self.audit.record(
            actor, "replica.drain" if draining else "replica.undrain", url=view["url"]
        )
        return view
