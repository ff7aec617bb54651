"""ReplicaAdmin: the replica table (the database) and the live fleet, kept in step.

Replicas named on the command line or in CHATBOX_REPLICAS live only in the running front;
those added with `chatbox replicas add` (this service, through the admin API) are kept in
the database and come back on the next start.
"""

from __future__ import annotations

from typing import Any

from chatbox.cluster.fleet import Fleet
from chatbox.cluster.protocol import ReplicaSpec
from chatbox.store.replicas import ReplicaRepo


class UnknownReplica(LookupError):
    """No replica has that URL."""


class ReplicaAdmin:
    def __init__(self, table: ReplicaRepo, fleet: Fleet) -> None:
        self.table = table
        self.fleet = fleet

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
        self, url: str, kind: str = "chatbox", slots: int = 0, models: tuple[str, ...] = ()
    ) -> dict[str, Any]:
        """Add (or re-point) a replica; ValueError for a malformed one."""
        spec = ReplicaSpec.parse(url if "+" in url.split("://", 1)[0] else f"{kind}+{url}")
        spec = ReplicaSpec(spec.url, spec.kind, slots or spec.slots, models or spec.models)
        await self.table.upsert(spec.url, spec.kind, spec.slots, spec.models)
        member = self.fleet.add(spec, "table")
        await self.fleet.check(member)
        return member.view()

    async def remove(self, url: str) -> None:
        url = url.rstrip("/")
        in_table = await self.table.remove(url)
        if not await self.fleet.remove(url) and not in_table:
            raise UnknownReplica(url)

    async def drain(self, url: str, draining: bool = True) -> dict[str, Any]:
        """Stop (or resume) new work on a replica; running answers finish there."""
        url = url.rstrip("/")
        member = self.fleet.members.get(url)
        if member is None:
            raise UnknownReplica(url)
        member.draining = draining
        await self.table.set_draining(url, draining)
        return member.view()
