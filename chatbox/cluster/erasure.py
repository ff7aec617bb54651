"""Erased conversations' KV on the replicas: the forget call, sent to every chatbox replica.

Affinity sends a conversation to one replica, but spill, failover, drain and a changed
fleet may have left its KV on others, so the call goes to every chatbox replica of the
model that may hold some, at once, and the erasure waits for them a short while only: a
replica that is down (or hangs) misses it. What it kept in RAM went with its process; what
it parked on disk ages out under its size cap and is never restored, since no request
carries an erased conversation's key again. OpenAI-kind replicas have nothing to call.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from chatbox.cluster.clients import ChatboxClient, ReplicaFailed
from chatbox.cluster.fleet import Fleet, Member

log = logging.getLogger("chatbox.cluster")
FORGET_TIMEOUT_S = 2.0  # a replica's forget is a few scheduler calls; a deletion never hangs


def holders(fleet: Fleet, model: str) -> list[Member]:
    """The chatbox replicas that may hold the model's KV: every one that reported the model
    and answers (draining ones too; ejected ones may be alive), not a down one."""
    return [
        m
        for m in fleet.members.values()
        if isinstance(m.client, ChatboxClient) and m.serves(model) and m.state != "down"
    ]


async def forget_on_replicas(
    fleet: Fleet,
    model: str,
    cache_keys: Sequence[str],
    timeout_s: float = FORGET_TIMEOUT_S,
    scopes: Sequence[str] = (),
) -> list[str]:
    """Send the forget call (conversations' keys, erased accounts' scopes) to every holder
    at once; return the URLs that missed it."""
    members = holders(fleet, model)
    if not members or not (cache_keys or scopes):
        return []
    keys, scoped = list(cache_keys), list(scopes)

    async def one(member: Member) -> str | None:
        assert isinstance(member.client, ChatboxClient)
        call = member.client.forget(model, keys, timeout_s, scoped)
        try:
            async with asyncio.timeout(timeout_s):
                await call
        except (ReplicaFailed, TimeoutError) as exc:
            log.warning(
                "replica %s missed the erasure of %d conversation(s) and %d account(s): %s",
                member.url,
                len(keys),
                len(scoped),
                str(exc) or "no reply in time",
            )
            return member.url
        return None

    missed = await asyncio.gather(*(one(m) for m in members))
    return [url for url in missed if url is not None]
