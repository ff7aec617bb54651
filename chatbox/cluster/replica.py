"""The replica server (`chatbox replica`): local engines over the replica protocol, as ASGI.

No UI, store or accounts: only `/v1/replica/health`, `/stats`, `/generate` (NDJSON events,
see `protocol`), `/tokenize`, `/forget` (erased conversations' KV) and `/load`, `/unload` (a
model of its catalogue, asked by the front's pre-warmer), each behind the shared secret (a
Bearer token compared in constant time). A replica without a token listens on loopback only
(the CLI enforces it) and refuses `/load` and `/unload`: they change what it holds in memory.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import asdict, replace
from typing import Any

from chatbox.cluster.protocol import (
    PREFIX,
    event_to_json,
    forget_from_json,
    line,
    request_from_json,
)
from chatbox.engine.pool import EnginePool
from chatbox.engine.types import (
    ContextOverflowError,
    DoneEvent,
    Engine,
    EngineBusyError,
    EngineError,
    EngineEvent,
    Generation,
    GenerationRequest,
    GrammarError,
    TokenEvent,
)
from chatbox.settings import EngineSettings

log = logging.getLogger("chatbox.replica")
MAX_BODY = 32 * 1024 * 1024
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
# Idle conversations a replica with a unified KV pool keeps cached by default, at least (the
# all-in-one server keeps one per slot): a replica does nothing else, and the front's
# affinity sends each conversation back to the replica that holds it, so a replica holds
# many users' chats. With a stream per slot (the default) each extra sequence would cost a
# whole stream of cells; idle conversations beyond the slots are parked and restored.
REPLICA_CACHED_SEQS = 32


def replica_engine_settings(engine: EngineSettings) -> EngineSettings:
    """A replica's engine defaults: settings left at their default (-1) get the replica's."""
    if engine.n_cached_seqs >= 0 or not engine.kv_unified:
        return engine
    return replace(engine, n_cached_seqs=max(REPLICA_CACHED_SEQS, 4 * engine.n_parallel))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ReplicaApp:
    """An ASGI app serving `models` from `pool`; `token` None means no auth (loopback only)."""

    def __init__(
        self,
        pool: EnginePool,
        models: list[str],
        token: str | None,
        heartbeat_s: float = 1.0,
        installed: Callable[[], list[str]] | None = None,
    ) -> None:
        self.pool = pool
        self.models = models
        self.token = token
        # The models of this replica's catalogue it may be asked to load (default: `models`).
        self.installed = installed or (lambda: list(models))
        self.heartbeat_s = heartbeat_s
        self.streams = 0  # answers being streamed to fronts now

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if not self._authorized(scope):
            await _json(send, 401, {"error": "a valid replica token is required"})
            return
        route = (scope["method"], scope["path"])
        if route == ("GET", PREFIX + "/health"):
            await _json(send, 200, await self.health())
        elif route == ("GET", PREFIX + "/stats"):
            await _json(send, 200, self.stats())
        elif route == ("POST", PREFIX + "/generate"):
            await self._generate(receive, send)
        elif route == ("POST", PREFIX + "/tokenize"):
            await self._tokenize(receive, send)
        elif route == ("POST", PREFIX + "/forget"):
            await self._forget(receive, send)
        elif route in (("POST", PREFIX + "/load"), ("POST", PREFIX + "/unload")):
            await self._load_or_unload(route[1].rsplit("/", 1)[1], receive, send)
        else:
            await _json(send, 404, {"error": "not found"})

    def _authorized(self, scope: Scope) -> bool:
        if self.token is None:
            return True
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, secret = given.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            secret.strip().encode(), self.token.encode()
        )

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    for name in self.models:  # load before the first health check says ready
                        await self.pool.get(name)
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.pool.stop_all()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def health(self) -> dict[str, Any]:
        stats = self.pool.stats()
        models: dict[str, Any] = {}
        for name in self.pool.loaded():
            engine = await self.pool.get(name)  # loaded: returns at once
            models[name] = {"n_ctx_per_seq": engine.info.n_ctx_per_seq}
        return {
            "models": models,
            "stats": {name: asdict(s) for name, s in stats.items()},
            "slots": self.pool.settings.n_parallel,
            "installed": sorted(set(self.installed()) | set(models)),
        }

    def stats(self) -> dict[str, Any]:
        """Load now and work done, per model: what an operator (or a test) watches."""
        registry = self.pool.registry
        models: dict[str, Any] = {}
        for name, stats in self.pool.stats().items():
            labels = {"model": name}
            generated = registry.get_sample_value("chatbox_engine_generated_tokens_total", labels)
            models[name] = {**asdict(stats), "generated_tokens": int(generated or 0)}
        return {"models": models, "streams": self.streams}

    async def _request(
        self, receive: Receive, send: Send
    ) -> tuple[Engine, GenerationRequest] | None:
        """The request's engine and request; None once a 400/404 has been sent."""
        try:
            model, request = request_from_json(await _body(receive))
        except ValueError as exc:
            await _json(send, 400, {"error": str(exc)})
            return None
        if model not in self.pool.loaded():
            await _json(send, 404, {"error": f"this replica does not serve {model!r}"})
            return None
        return await self.pool.get(model), request

    async def _generate(self, receive: Receive, send: Send) -> None:
        got = await self._request(receive, send)
        if got is None:
            return
        engine, request = got
        try:
            gen = engine.submit(request)
        except ContextOverflowError as exc:
            body = {"error": str(exc), "prompt_tokens": exc.prompt_tokens, "limit": exc.limit}
            await _json(send, 413, body)
            return
        except GrammarError as exc:  # the caller's mistake: refused, never a failed replica
            await _json(send, 400, {"error": str(exc)})
            return
        except EngineBusyError as exc:
            await _json(send, 429, {"error": str(exc)})
            return
        except EngineError as exc:
            await _json(send, 503, {"error": str(exc)})
            return
        await self._stream(gen, receive, send)

    async def _stream(self, gen: Generation, receive: Receive, send: Send) -> None:
        events: asyncio.Queue[EngineEvent] = asyncio.Queue()

        async def pump() -> None:
            async for event in gen:
                events.put_nowait(event)

        async def watch() -> None:  # a closed connection is the cancel
            while (await receive())["type"] != "http.disconnect":
                pass
            gen.cancel()

        pumping = asyncio.create_task(pump())
        watching = asyncio.create_task(watch())
        self.streams += 1
        try:
            await send(_start(200, "application/x-ndjson"))
            prompt = int(getattr(gen, "prompt_tokens", 0))
            await send(_chunk(line({"type": "start", "prompt_tokens": prompt})))
            sent = 0
            while True:
                try:
                    async with asyncio.timeout(self.heartbeat_s):
                        event = await events.get()
                except TimeoutError:
                    await send(_chunk(line({"type": "wait"})))
                    continue
                batch = [event]
                while not events.empty():  # coalesce what is ready: one write, not one each
                    batch.append(events.get_nowait())
                out = bytearray()
                finished = False
                for joined in batch:
                    # one line per token, as the engine made them: the front's OpenAI
                    # stream writes a chunk per token
                    singles = joined.parts if isinstance(joined, TokenEvent) else ()
                    for item in singles or (joined,):
                        if isinstance(item, TokenEvent):
                            sent += 1
                        out += line(event_to_json(item, sent))
                    finished = finished or isinstance(joined, DoneEvent)
                await send(_chunk(bytes(out), more=not finished))
                if finished:
                    return
        except OSError:  # the front went away mid-write
            gen.cancel()
        finally:
            self.streams -= 1
            watching.cancel()
            if not pumping.done():
                gen.cancel()
                pumping.cancel()

    async def _tokenize(self, receive: Receive, send: Send) -> None:
        got = await self._request(receive, send)
        if got is None:
            return
        engine, request = got
        tokens = await asyncio.to_thread(engine.count_tokens, request.messages, request.tools)
        await _json(send, 200, {"tokens": tokens})

    async def _forget(self, receive: Receive, send: Send) -> None:
        """Conversations (or whole accounts, by cache scope) were erased at the front: drop
        their KV from the model (or every loaded model) here, live, parked in RAM and on
        disk, before answering."""
        try:
            model, keys, scopes = forget_from_json(await _body(receive))
        except ValueError as exc:
            await _json(send, 400, {"error": str(exc)})
            return
        loaded = self.pool.loaded()
        if model is not None and model not in loaded:
            await _json(send, 404, {"error": f"this replica does not serve {model!r}"})
            return
        names = [model] if model is not None else list(loaded)
        for name in names:
            engine = await self.pool.get(name)  # loaded: returns at once
            forget = getattr(engine, "forget", None)
            if forget is not None:
                for key in keys:
                    await forget(key)
            forget_scope = getattr(engine, "forget_scope", None)
            if forget_scope is not None:
                for scope in scopes:
                    await forget_scope(scope)
        await _json(send, 200, {"models": names, "cache_keys": len(keys), "scopes": len(scopes)})

    async def _load_or_unload(self, action: str, receive: Receive, send: Send) -> None:
        """Load a model of this replica's catalogue (answered once it is loaded), or unload
        an idle one (one with answers running or waiting is refused: 409)."""
        if self.token is None:
            await _json(
                send, 403, {"error": f"a replica without a token cannot be asked to {action}"}
            )
            return
        try:
            body = await _body(receive)
        except ValueError as exc:
            await _json(send, 400, {"error": str(exc)})
            return
        model = body.get("model") if isinstance(body, dict) else None
        if not isinstance(model, str) or not model:
            await _json(send, 400, {"error": 'the body must be {"model": NAME}'})
            return
        if action == "load":
            installed = self.installed()
            if model not in installed:
                names = ", ".join(installed) or "none"
                await _json(send, 404, {"error": f"no model {model!r} here (installed: {names})"})
                return
            try:
                await self.pool.get(model)
            except Exception as exc:  # a file that will not load: the front is told why
                log.warning("loading %s on request failed: %s", model, exc)
                await _json(send, 409, {"error": f"{model!r} failed to load: {exc}"})
                return
            log.info("loaded %s on the front's request", model)
        else:
            if model not in self.pool.loaded():
                await _json(send, 404, {"error": f"{model!r} is not loaded here"})
                return
            stats = self.pool.stats().get(model)
            if stats is not None and stats.running + stats.queue_depth > 0:
                await _json(send, 409, {"error": f"{model!r} is answering: not unloaded"})
                return
            await self.pool.unload(model)
            log.info("unloaded %s on the front's request", model)
        await _json(send, 200, {"model": model, "loaded": sorted(self.pool.loaded())})


async def _body(receive: Receive) -> Any:
    data = bytearray()
    while True:
        message = await receive()
        data += message.get("body", b"")
        if len(data) > MAX_BODY:
            raise ValueError("the request is too large")
        if not message.get("more_body"):
            break
    try:
        return json.loads(data or b"null")
    except json.JSONDecodeError as exc:
        raise ValueError(f"the body is not JSON: {exc}") from exc


def _start(status: int, content_type: str) -> dict[str, Any]:
    return {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", content_type.encode()), (b"cache-control", b"no-store")],
    }


def _chunk(data: bytes, more: bool = True) -> dict[str, Any]:
    return {"type": "http.response.body", "body": data, "more_body": more}


async def _json(send: Send, status: int, payload: dict[str, Any]) -> None:
    await send(_start(status, "application/json"))
    await send(_chunk(json.dumps(payload).encode(), more=False))
