"""ReplicaAdmin: the replica table (the database) and the live fleet, kept in step.

Replicas named on the command line or in CHATBOX_REPLICAS live only in the running front;
those added with `chatbox replicas add` (this service, through the admin API) are kept in
the database and come back on the next start. Every change is recorded in the audit log.
"""

from __future__ import annotations

from typing import Any

from chatbox.accounts import User
from chatbox.accounts.audit import Actor, AuditLog
from chatbox.cluster.fleet import Fleet
from chatbox.cluster.protocol import ReplicaSpec
from chatbox.store.replicas import ReplicaRepo


class UnknownReplica(LookupError):
    """No replica has that URL."""


class ReplicaAdmin:
    def __init__(self, table: ReplicaRepo, fleet: Fleet, audit: AuditLog) -> None:
        self.table = table
        self.fleet = fleet
        self.audit = audit

    async def start(self, flags: tuple[str, ...]) -> None:
        """Load the table and the flag replicas, check them once, then keep checking."""
        for text in flags:
            self.fleet.add(ReplicaSpec.parse(text), "flag")
        for row in await self.table.list():
            spec = ReplicaSpec(row.url, row.kind, row.slots, row.models, row.secret)
            self.fleet.add(spec, "table", row.draining)
        await self.fleet.check_all()  # routing works from the first request
        self.fleet.start()

    async def stop(self) -> None:
        await self.fleet.stop()

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
        await self.table.upsert(spec.url, spec.kind, spec.slots, spec.models)
        member = self.fleet.add(spec, "table")
        await self.fleet.check(member)
        view = member.view()
        await self.audit.record(actor, "replica.add", url=view["url"], kind=view["kind"])
        return view

    async def remove(self, actor: Actor | User, url: str) -> None:
        """Remove a replica; answers running there finish first (they hold their stream)."""
        given = url
        url = url.rstrip("/")
        in_table = await self.table.remove(url)
        if not await self.fleet.remove(url) and not in_table:
            raise UnknownReplica(url)
        await self.audit.record(actor, "replica.remove", url=given)

    async def drain(self, actor: Actor | User, url: str, draining: bool = True) -> dict[str, Any]:
        """Stop (or resume) new work on a replica; running answers finish there."""
        url = url.rstrip("/")
        member = self.fleet.members.get(url)
        if member is None:
            raise UnknownReplica(url)
        member.draining = draining
        await self.table.set_draining(url, draining)
        view = member.view()
        await self.audit.record(
            actor, "replica.drain" if draining else "replica.undrain", url=view["url"]
        )
        return view
