"""RemoteEngine: one model served by the fleet, behind the local engine's protocol.

A generation streams from the replica its affinity key picks. If that replica dies, resets
or goes silent mid-answer, the same request is sent to the next replica with the answer so
far as `continue_text`, so the stream goes on where it stopped (one answer, charged once).
An OpenAI server that cannot continue restarts the answer after a visible notice.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

from chatbox.cluster.clients import (
    CannotContinue,
    ReplicaBusy,
    ReplicaFailed,
    ReplicaRefused,
    Started,
)
from chatbox.cluster.erasure import forget_on_replicas
from chatbox.cluster.fleet import Fleet, Member
from chatbox.cluster.local import LOCAL, LocalClient
from chatbox.cluster.protocol import estimate_tokens
from chatbox.engine.types import (
    ChatMessage,
    DoneEvent,
    EngineBusyError,
    EngineEvent,
    EngineStats,
    GenerationRequest,
    ModelInfo,
    TokenEvent,
    ToolSpec,
    Usage,
)

log = logging.getLogger("chatbox.cluster")
RESTART_NOTICE = "\n\n[the server writing this answer failed; it starts again here]\n\n"
DEFAULT_N_CTX = 4096
TPOT_SAMPLES = 512  # the most per-token observations one answer's stream adds


def affinity_key(request: GenerationRequest) -> str:
    """The conversation id, or a hash of the prompt's start (system prompt + first message)."""
    if request.cache_key:
        return request.cache_key
    head = "\0".join(f"{m.role}:{m.content}" for m in request.messages[:2])
    return hashlib.sha256(head.encode()).hexdigest()


class RemoteEngine:
    """The fleet's replicas of one model as one engine."""

    def __init__(self, fleet: Fleet, name: str) -> None:
        self.fleet = fleet
        self.name = name

    @property
    def info(self) -> ModelInfo:
        """Read live (replicas come and go): the smallest context of the model's replicas."""
        n_ctx = self.fleet.n_ctx(self.name) or DEFAULT_N_CTX
        return ModelInfo(self.name, "", n_ctx, n_ctx, "remote")

    @info.setter
    def info(self, value: ModelInfo) -> None:
        raise AttributeError("a remote engine's info comes from its replicas")

    def count_tokens(
        self, messages: tuple[ChatMessage, ...], tools: tuple[ToolSpec, ...] = ()
    ) -> int:
        """Exact from a replica when called off the event loop (as the chat layer does)."""
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        if not on_loop:
            for member in self.fleet.order(self.name, "count"):
                try:
                    return member.client.count_tokens(self.name, messages, tools)
                except Exception:  # no tokenizer there, or it is failing: try the next
                    continue
        return estimate_tokens(messages, tools)

    def submit(self, request: GenerationRequest) -> RemoteGeneration:
        """Raises EngineBusyError (a 503 with Retry-After) while no replica can take it."""
        if not self.fleet.order(self.name, ""):
            raise EngineBusyError(f"no healthy replica serves {self.name} now; try again shortly")
        return RemoteGeneration(self, request)

    async def forget(self, cache_key: str) -> None:
        await self.forget_many([cache_key])

    async def forget_many(self, cache_keys: Sequence[str]) -> None:
        """Conversations were erased: drop their KV from this front's own engine, if it is
        in the ring, and from every chatbox replica of the model (see `cluster.erasure`)."""
        member = self.fleet.members.get(LOCAL)
        client = member.client if member is not None else None
        engine = client.loaded(self.name) if isinstance(client, LocalClient) else None
        forget = getattr(engine, "forget", None)
        if forget is not None:
            for key in cache_keys:
                await forget(key)
        await forget_on_replicas(self.fleet, self.name, cache_keys)

    async def forget_scope(self, scope: str) -> None:
        """An account was erased: drop its scope's KV (its stateless completions' too, whose
        keys nobody else knows) from this front's own engine and every chatbox replica."""
        member = self.fleet.members.get(LOCAL)
        client = member.client if member is not None else None
        engine = client.loaded(self.name) if isinstance(client, LocalClient) else None
        forget = getattr(engine, "forget_scope", None)
        if forget is not None:
            await forget(scope)
        await forget_on_replicas(self.fleet, self.name, [], scopes=[scope])

    def stats(self) -> EngineStats:
        return self.fleet.stats(self.name) or EngineStats()

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


class RemoteGeneration:
    """A request on the fleet: events arrive through a queue fed by a pump task."""

    def __init__(self, engine: RemoteEngine, request: GenerationRequest) -> None:
        self.engine = engine
        self.request = request
        self.prompt_tokens = 0
        self.text = ""  # what the client has been sent
        self.tokens = 0
        self.replicas: list[str] = []  # where it ran, in order (failovers add to it)
        self._submitted = time.monotonic()
        self._answered = False  # a token reached the client (its time is the TTFT)
        self._events: asyncio.Queue[EngineEvent] = asyncio.Queue()
        self._finished = False
        self._pump = asyncio.get_running_loop().create_task(self._run())

    def __aiter__(self) -> AsyncIterator[EngineEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[EngineEvent]:
        try:
            while not self._finished:
                event = await self._events.get()
                if isinstance(event, DoneEvent):
                    self._finished = True
                yield event
        finally:
            if not self._finished:
                self.cancel()

    def cancel(self) -> None:
        """Closes the replica's stream (which cancels it there); a Done follows."""
        if not self._pump.done():
            self._pump.cancel()

    def _usage(self, last: Usage | None = None) -> Usage:
        """Charged once: the original prompt, and every token the client received."""
        cached = last.cached_tokens if last and len(self.replicas) == 1 else 0
        return Usage(self.prompt_tokens, self.tokens, cached)

    def _done(self, reason: str, last: Usage | None = None, error: str | None = None) -> None:
        if not self.replicas or self.replicas[-1] != LOCAL:  # the local engine counts its own
            self.engine.fleet.per_model.requests.labels(self.engine.name, reason).inc()
        self._events.put_nowait(DoneEvent(reason, self._usage(last), error))  # type: ignore[arg-type]

    async def _run(self) -> None:
        fleet, model = self.engine.fleet, self.engine.name
        key = affinity_key(self.request)
        tried: set[str] = set()
        busy = False
        try:
            await fleet.recall(key)  # placed off its hash order by another front?
            while True:
                member = fleet.pick(model, key, tried)
                if member is None:
                    self._done("error", error=self._no_replica(tried, busy))
                    return
                tried.add(member.url)
                if self.replicas:
                    fleet.failovers.labels(model, self.replicas[-1]).inc()
                self.replicas.append(member.url)
                try:
                    with fleet.lease(member, model):
                        if await self._stream(member):
                            return
                except ReplicaBusy:  # its own queue is full: the next in hash order takes it
                    self.replicas.pop()
                    fleet.spills.labels(model).inc()
                    busy = True
                    continue
                except CannotContinue:
                    tried.discard(member.url)  # it may restart the answer itself
                    self.replicas.clear()
                except ReplicaRefused as exc:
                    if self.text and exc.limit:
                        # The answer so far fills the context (its text tokenised afresh
                        # can take more tokens than were written): it ends here, at length.
                        self._done("length")
                    else:
                        self._done("error", error=str(exc))
                    return
                except ReplicaFailed as exc:
                    fleet.eject(member, str(exc))
        except asyncio.CancelledError:
            self._done("cancelled")
            raise
        except Exception as exc:  # a bug here must end the answer, not hang it
            log.exception("remote generation failed")
            self._done("error", error=f"generation failed: {exc}")

    async def _stream(self, member: Member) -> bool:
        """Stream from one replica; True once the answer is done."""
        request = self.request
        before = self.tokens  # what the client had received when this replica took over
        if self.text:
            request = replace(
                request,
                continue_text=self.text,
                sampling=replace(
                    request.sampling, max_tokens=max(1, request.sampling.max_tokens - self.tokens)
                ),
            )
        # Tokens from this replica, counted as they arrive (one per event: a replica may
        # batch several in one) and made exact by its usage at the end.
        streamed, counted = self.engine.fleet.per_replica.tokens.labels(member.url), 0
        figures = _Figures(self.engine, member, request.metered)
        try:
            stream = member.client.stream(self.engine.name, request)
            async for event in stream:
                if isinstance(event, Started):
                    if len(self.replicas) == 1:
                        self.prompt_tokens = event.prompt_tokens
                elif isinstance(event, TokenEvent):
                    figures.token(self._submitted, first=not self._answered)
                    self._answered = True
                    self.text += event.text
                    self.tokens += 1
                    streamed.inc()
                    counted += 1
                    self._events.put_nowait(event)
                else:
                    streamed.inc(max(0, event.usage.completion_tokens - counted))
                    figures.done(event.usage, counted)
                    self._count(request, event.usage, before)
                    self.engine.fleet.succeeded(
                        member, event.usage.prompt_tokens, event.usage.cached_tokens
                    )
                    self._done(event.finish_reason, event.usage, event.error)
                    return True
        except CannotContinue:
            self._events.put_nowait(TokenEvent(RESTART_NOTICE))
            self.text, self.tokens = "", 0  # the notice is shown; the answer starts over
            raise
        return False

    def _count(self, request: GenerationRequest, usage: Usage, before: int) -> None:
        """Charge as without a failover: the original prompt once, and the answer's tokens,
        never past its `max_tokens`."""
        if not request.continue_text:
            self.prompt_tokens = self.prompt_tokens or usage.prompt_tokens
            self.tokens = usage.completion_tokens or self.tokens
        elif self.prompt_tokens and usage.prompt_tokens > self.prompt_tokens:
            # The continued prompt holds the partial answer: its tokens, counted by the
            # tokenizer rather than by events, plus what this replica wrote.
            self.tokens = usage.prompt_tokens - self.prompt_tokens + usage.completion_tokens
        else:  # the first replica never said its prompt's size (an OpenAI server's stream)
            self.prompt_tokens = max(0, usage.prompt_tokens - before)
            self.tokens = before + usage.completion_tokens
        self.tokens = min(self.tokens, self.request.sampling.max_tokens)

    def _no_replica(self, tried: set[str], busy: bool) -> str:
        if busy and not self.text:
            return "every replica is busy; please retry in a few seconds"
        if tried:
            return "no replica is left to finish this answer"
        return f"no healthy replica serves {self.engine.name}"


class _Figures:
    """The per-model figures (`model_metrics`) of one stream from one replica; nothing for
    the member "local", whose engine records its own, nor for an unmetered request."""

    def __init__(self, engine: RemoteEngine, member: Member, metered: bool = True) -> None:
        self.on = member.source != LOCAL and metered
        self.cache = member.spec.kind != "openai"  # chatbox replicas report cached tokens
        figures, model = engine.fleet.per_model, engine.name
        self.ttft, self.tpot = figures.ttft.labels(model), figures.tpot.labels(model)
        self.tokens = figures.tokens.labels(model)
        self.hit, self.miss = figures.cache_hit.labels(model), figures.cache_miss.labels(model)
        self.first: float | None = None  # this stream's first token event

    def token(self, submitted: float, first: bool) -> None:
        """A token event arrived; the answer's first gives its time to first token."""
        if not self.on:
            return
        now = time.monotonic()
        if self.first is None:
            self.first = now
        if first:
            self.ttft.observe(now - submitted)
        self.tokens.inc()

    def done(self, usage: Usage, counted: int) -> None:
        """Exact tokens and cache use from the replica's usage, and the time per token.

        An event may carry several tokens (a replica or this front catching up joins them),
        so gaps between events are no per-token times: the stream's time from its first
        token to its end is spread evenly over its tokens, one observation per gap as the
        engine makes (at most `TPOT_SAMPLES`, so a long answer costs no more than that).
        """
        if not self.on:
            return
        self.tokens.inc(max(0, usage.completion_tokens - counted))
        if self.cache and usage.prompt_tokens:
            self.hit.inc(usage.cached_tokens)
            self.miss.inc(max(0, usage.prompt_tokens - usage.cached_tokens))
        gaps = usage.completion_tokens - 1
        if self.first is not None and gaps > 0:
            per_token = (time.monotonic() - self.first) / gaps
            for _ in range(min(gaps, TPOT_SAMPLES)):
                self.tpot.observe(per_token)
