"""The admin API of router mode's replicas (what `chatbox replicas` talks to)."""

from __future__ import annotations

from litestar import Controller, delete, get, post
from litestar.exceptions import NotFoundException, PermissionDeniedException, ValidationException
from msgspec import Struct, convert

from chatbox.accounts import User
from chatbox.cluster.admin import UnknownReplica
from chatbox.web.deps import ServicesDep, UserDep
from chatbox.web.errors import ERROR_RESPONSES


class ReplicaIn(Struct, forbid_unknown_fields=True):
    url: str
    kind: str = "chatbox"
    slots: int = 0
    models: list[str] = []


class DrainIn(Struct, forbid_unknown_fields=True):
    url: str
    undo: bool = False


class ReplicaOut(Struct, forbid_unknown_fields=True):
    """A replica as the front sees it now."""

    url: str
    kind: str
    source: str
    state: str
    models: list[str]
    slots: int
    running: int
    queued: int
    served: int
    prefix_hit_rate: float | None
    last_error: str | None


class ReplicasOut(Struct):
    replicas: list[ReplicaOut]


class RemovedOut(Struct):
    removed: str  # the replica's URL


def _admin(user: User) -> None:
    if user.role != "admin":
        raise PermissionDeniedException("only admins can manage replicas")


class ReplicasController(Controller):
    path = "/v1/admin/replicas"
    tags = ["admin"]

    @get("/")
    async def list_replicas(self, services: ServicesDep, user: UserDep) -> ReplicasOut:
        """Each replica's state, models, running/queued, prefix hit rate and last error."""
        _admin(user)
        return ReplicasOut([convert(r, ReplicaOut) for r in services.replicas.list()])

    @post("/", status_code=201, responses=ERROR_RESPONSES)
    async def add(self, data: ReplicaIn, services: ServicesDep, user: UserDep) -> ReplicaOut:
        """Add a replica (kept in the database) and check it at once."""
        _admin(user)
        if data.kind not in ("chatbox", "openai") or data.slots < 0:
            raise ValidationException("kind must be chatbox or openai; slots 0 or more")
        try:
            view = await services.replicas.add(
                user, data.url, data.kind, data.slots, tuple(data.models)
            )
        except ValueError as exc:
            raise ValidationException(str(exc)) from exc
        return convert(view, ReplicaOut)

    @delete("/", status_code=200, responses=ERROR_RESPONSES)
    async def remove(self, url: str, services: ServicesDep, user: UserDep) -> RemovedOut:
        """Remove a replica; answers running there finish first (they hold their stream)."""
        _admin(user)
        try:
            await services.replicas.remove(user, url)
        except UnknownReplica as exc:
            raise NotFoundException(f"no replica {url}") from exc
        return RemovedOut(url)

    @post("/drain", status_code=200, responses=ERROR_RESPONSES)
    async def drain(self, data: DrainIn, services: ServicesDep, user: UserDep) -> ReplicaOut:
        """Stop new work on a replica (undo: take work again); running answers finish."""
        _admin(user)
        try:
            view = await services.replicas.drain(user, data.url, not data.undo)
        except UnknownReplica as exc:
            raise NotFoundException(f"no replica {data.url}") from exc
        return convert(view, ReplicaOut)
