"""Talking to one replica: a chatbox replica (the replica protocol) or an OpenAI server.

Both clients stream a request as `Started`, `TokenEvent`s and one `DoneEvent`, and raise
`ReplicaFailed` for anything that should eject the replica (refused connection, reset,
silence past the deadline, garbage), `ReplicaBusy` for a full queue (spill, not eject) and
`ReplicaRefused` for a request no replica could serve (too long, unknown model).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from chatbox.cluster.protocol import (
    PREFIX,
    ProtocolError,
    ReplicaSpec,
    estimate_tokens,
    event_from_json,
    forget_to_json,
    request_to_json,
    stats_from_json,
)
from chatbox.engine.types import (
    ChatMessage,
    DoneEvent,
    EngineStats,
    FinishReason,
    GenerationRequest,
    TokenEvent,
    Usage,
)


class ReplicaFailed(Exception):
    """The replica broke (or went silent): eject it and carry on elsewhere."""


class ReplicaBusy(Exception):
    """The replica's queue is full: try the next one."""


class ReplicaRefused(Exception):
    """The request itself was refused (it would be anywhere)."""

    def __init__(self, message: str, prompt_tokens: int = 0, limit: int = 0) -> None:
        super().__init__(message)
        self.prompt_tokens = prompt_tokens
        self.limit = limit


class CannotContinue(Exception):
    """This replica cannot continue a partial answer (the caller restarts it, saying so)."""


@dataclass(frozen=True)
class Started:
    prompt_tokens: int


@dataclass
class Health:
    models: dict[str, int]  # model -> tokens one conversation may hold (0: unknown)
    slots: int
    stats: dict[str, EngineStats] = field(default_factory=dict)
    installed: tuple[str, ...] = ()  # models it may be asked to load (chatbox replicas)


StreamEvent = Started | TokenEvent | DoneEvent


def _http(spec: ReplicaSpec, timeout_s: float) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {spec.secret}"} if spec.secret else {}
    return httpx.AsyncClient(
        base_url=spec.url,
        headers=headers,
        timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 3.0)),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
    )


def _failure(exc: Exception, timeout_s: float) -> ReplicaFailed:
    if isinstance(exc, httpx.TimeoutException):
        return ReplicaFailed(f"no reply within {timeout_s:g} s")
    return ReplicaFailed(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


async def _refusal(resp: httpx.Response) -> Exception:
    """The exception for a non-200 answer to a generate call."""
    body = await resp.aread()
    try:
        payload = json.loads(body)
        message = str(payload.get("error") or payload.get("message") or payload)
    except (ValueError, AttributeError):
        payload, message = {}, body[:200].decode("utf-8", "replace")
    if resp.status_code == 429:
        return ReplicaBusy(message)
    if resp.status_code == 413:
        return ReplicaRefused(message, int(payload["prompt_tokens"]), int(payload["limit"]))
    if resp.status_code in (400, 404, 422):
        return ReplicaRefused(message)
    return ReplicaFailed(f"HTTP {resp.status_code}: {message}")


class ChatboxClient:
    """A `chatbox replica`: continues partial answers, reports cached tokens and load."""

    can_continue = True

    def __init__(self, spec: ReplicaSpec, timeout_s: float) -> None:
        self.spec = spec
        self.timeout_s = timeout_s
        self.http = _http(spec, timeout_s)
        # For count_tokens from worker threads. Kept, not made per call: building a client
        # loads the CA bundle (an SSL context), which cost more CPU than the call itself
        # and was the front's largest per-request cost in router mode.
        self._sync: httpx.Client | None = None
        self._sync_lock = threading.Lock()

    def _sync_http(self) -> httpx.Client:
        with self._sync_lock:
            if self._sync is None:
                secret = self.spec.secret
                headers = {"Authorization": f"Bearer {secret}"} if secret else {}
                self._sync = httpx.Client(base_url=self.spec.url, headers=headers, timeout=5.0)
            return self._sync

    async def health(self) -> Health:
        try:
            resp = await self.http.get(PREFIX + "/health")
            if resp.status_code != 200:
                raise ReplicaFailed(f"health: HTTP {resp.status_code}")
            payload = resp.json()
            models = {str(k): int(v["n_ctx_per_seq"]) for k, v in payload["models"].items()}
            stats = {str(k): stats_from_json(v) for k, v in payload.get("stats", {}).items()}
            installed = tuple(str(m) for m in payload.get("installed", ()))
            return Health(models, self.spec.slots or int(payload["slots"]), stats, installed)
        except httpx.HTTPError as exc:
            raise _failure(exc, self.timeout_s) from exc
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ReplicaFailed(f"health: not a replica's answer ({exc})") from exc

    async def stream(self, model: str, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        body = request_to_json(model, request)
        try:
            async with self.http.stream("POST", PREFIX + "/generate", json=body) as resp:
                if resp.status_code != 200:
                    raise await _refusal(resp)
                async for raw in resp.aiter_lines():
                    if not raw:
                        continue
                    event = _parse_line(raw)
                    if event is not None:
                        yield event
                        if isinstance(event, DoneEvent):
                            return
        except httpx.HTTPError as exc:
            raise _failure(exc, self.timeout_s) from exc
        except ProtocolError as exc:
            raise ReplicaFailed(str(exc)) from exc
        raise ReplicaFailed("the stream ended before the answer did")

    def count_tokens(self, model: str, messages: tuple[ChatMessage, ...]) -> int:
        """Exact prompt tokens, asked synchronously (call from a worker thread)."""
        body = request_to_json(model, GenerationRequest(messages))
        resp = self._sync_http().post(PREFIX + "/tokenize", json=body)
        resp.raise_for_status()
        return int(resp.json()["tokens"])

    async def forget(
        self,
        model: str | None,
        cache_keys: list[str],
        timeout_s: float,
        scopes: list[str] | None = None,
    ) -> None:
        """Drop erased conversations' (and erased accounts' scopes') KV there (the model's,
        or every model's with None)."""
        body = forget_to_json(model, cache_keys, scopes)
        try:
            resp = await self.http.post(PREFIX + "/forget", json=body, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise _failure(exc, timeout_s) from exc
        if resp.status_code != 200:
            raise ReplicaFailed(f"forget: HTTP {resp.status_code}: {resp.text[:200]}")

    async def load(self, model: str, timeout_s: float) -> None:
        """Ask the replica to load a model of its catalogue; returns once it is loaded."""
        await self._model_call("load", model, timeout_s)

    async def unload(self, model: str, timeout_s: float) -> None:
        """Ask the replica to unload an idle model."""
        await self._model_call("unload", model, timeout_s)

    async def _model_call(self, action: str, model: str, timeout_s: float) -> None:
        try:
            resp = await self.http.post(
                f"{PREFIX}/{action}", json={"model": model}, timeout=timeout_s
            )
        except httpx.HTTPError as exc:
            raise _failure(exc, timeout_s) from exc
        if resp.status_code != 200:
            raise ReplicaFailed(f"{action} {model}: HTTP {resp.status_code}: {resp.text[:200]}")

    async def close(self) -> None:
        await self.http.aclose()
        if self._sync is not None:
            self._sync.close()


def _parse_line(raw: str) -> StreamEvent | None:
    try:
        payload = json.loads(raw)
    except ValueError as exc:
        raise ProtocolError(f"not an event: {raw[:80]!r}") from exc
    if not isinstance(payload, dict):
        raise ProtocolError(f"not an event: {raw[:80]!r}")
    kind = payload.get("type")
    if kind in ("token", "done"):
        return event_from_json(payload)
    if kind == "start":
        return Started(int(payload.get("prompt_tokens") or 0))
    if kind == "wait":
        return None
    raise ProtocolError(f"unknown event {kind!r}")


class OpenAIClient:
    """Any OpenAI-compatible server: chat completions streamed as SSE, cancel by closing.

    It cannot keep priorities, pacing, KV parking or per-user cache privacy. A partial
    answer is continued through raw `/v1/completions` when the server renders its chat
    template for us (llama-server's `/apply-template`); otherwise `CannotContinue`.
    """

    def __init__(self, spec: ReplicaSpec, timeout_s: float) -> None:
        self.spec = spec
        self.timeout_s = timeout_s
        self.http = _http(spec, timeout_s)
        self.names = spec.model_map()
        self.can_continue = False  # learned from /apply-template at the health check

    async def health(self) -> Health:
        try:
            resp = await self.http.get("/v1/models")
            if resp.status_code != 200:
                raise ReplicaFailed(f"/v1/models: HTTP {resp.status_code}")
            ids = [str(m["id"]) for m in resp.json()["data"]]
            probe = await self.http.post(
                "/apply-template", json={"messages": [{"role": "user", "content": "hi"}]}
            )
            self.can_continue = probe.status_code == 200 and "prompt" in probe.text
        except httpx.HTTPError as exc:
            raise _failure(exc, self.timeout_s) from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise ReplicaFailed(f"/v1/models: not an OpenAI answer ({exc})") from exc
        if self.names:
            models = {n: 0 for n, remote in self.names.items() if remote in ids or not ids}
            if not models:
                mapped = ", ".join(f"{n}={r}" for n, r in self.names.items())
                served = ", ".join(ids) or "nothing"
                raise ReplicaFailed(f"serves none of {mapped} (it serves {served})")
        else:
            models = dict.fromkeys(ids, 0)
        return Health(models, self.spec.slots or 1)

    async def stream(self, model: str, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        body = self._body(model, request)
        path = "/v1/chat/completions"
        if request.prompt is not None:  # a raw prompt: the server's text completions
            path = "/v1/completions"
            body.pop("messages")
            body["prompt"] = request.prompt + request.continue_text
        elif request.continue_text:
            if not self.can_continue:
                raise CannotContinue(self.spec.url)
            path = "/v1/completions"
            body.pop("messages")
            body["prompt"] = await self._render(request.messages) + request.continue_text
        chunks = 0
        usage: Usage | None = None
        reason: FinishReason = "stop"
        finished = False
        try:
            async with self.http.stream("POST", path, json=body) as resp:
                if resp.status_code != 200:
                    raise await _refusal(resp)
                yield Started(0)
                async for raw in resp.aiter_lines():
                    if not raw.startswith("data:"):
                        continue
                    data = raw[5:].strip()
                    if data == "[DONE]":
                        if not finished:  # cut short (llama-cpp-python's interrupt_requests)
                            raise ReplicaFailed("the answer ended without a finish reason")
                        # No usage reported: the prompt estimated, one token per chunk.
                        completion = usage or Usage(estimate_tokens(request.messages), chunks, 0)
                        yield DoneEvent(reason, completion)
                        return
                    chunk = _sse_json(data)
                    if chunk.get("usage"):
                        usage = _usage(chunk["usage"])
                    for choice in chunk.get("choices") or []:
                        delta = choice.get("delta") or {}
                        text = delta.get("content") or choice.get("text")
                        if "content" in delta or "text" in choice:  # a token, maybe no text
                            chunks += 1
                        if text:
                            yield TokenEvent(str(text))
                        if choice.get("finish_reason"):
                            finished = True
                            reason = "length" if choice["finish_reason"] == "length" else "stop"
        except httpx.HTTPError as exc:
            raise _failure(exc, self.timeout_s) from exc
        raise ReplicaFailed("the stream ended before [DONE]")

    def _body(self, model: str, request: GenerationRequest) -> dict[str, Any]:
        s = request.sampling
        body: dict[str, Any] = {
            "model": self.names.get(model, model),
            "messages": [{"role": m.role, "content": m.content} for m in request.messages],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "presence_penalty": s.presence_penalty,
            "frequency_penalty": s.frequency_penalty,
        }
        if s.stop:
            body["stop"] = list(s.stop)
        if s.seed is not None:
            body["seed"] = s.seed
        if request.cache_scope:  # OpenAI's end-user field: an opaque id, never the user's name
            body["user"] = hashlib.sha256(request.cache_scope.encode()).hexdigest()[:16]
        return body

    async def _render(self, messages: tuple[ChatMessage, ...]) -> str:
        payload = {"messages": [{"role": m.role, "content": m.content} for m in messages]}
        resp = await self.http.post("/apply-template", json=payload)
        if resp.status_code != 200:
            raise CannotContinue(self.spec.url)
        return str(resp.json()["prompt"])

    def count_tokens(self, model: str, messages: tuple[ChatMessage, ...]) -> int:
        raise NotImplementedError("OpenAI servers have no common tokenize endpoint")

    async def forget(
        self,
        model: str | None,
        cache_keys: list[str],
        timeout_s: float,
        scopes: list[str] | None = None,
    ) -> None:
        """Nothing to call: such a server's prompt cache is its own (keyed by prompt text,
        not by conversation, and it ages out there); chatbox cannot drop an entry of it."""
        return None

    async def close(self) -> None:
        await self.http.aclose()


def _sse_json(data: str) -> dict[str, Any]:
    try:
        chunk = json.loads(data)
    except ValueError as exc:
        raise ReplicaFailed(f"not an SSE chunk: {data[:80]!r}") from exc
    if not isinstance(chunk, dict):
        raise ReplicaFailed(f"not an SSE chunk: {data[:80]!r}")
    return chunk


def _usage(raw: Any) -> Usage:
    details = raw.get("prompt_tokens_details") or {}
    return Usage(
        int(raw.get("prompt_tokens") or 0),
        int(raw.get("completion_tokens") or 0),
        int(details.get("cached_tokens") or 0),
    )


class Client(Protocol):
    """How the fleet talks to one replica (remote, or this front's own engine)."""

    can_continue: bool

    async def health(self) -> Health: ...

    def stream(self, model: str, request: GenerationRequest) -> AsyncIterator[StreamEvent]: ...

    def count_tokens(self, model: str, messages: tuple[ChatMessage, ...]) -> int: ...

    async def close(self) -> None: ...


def client_for(spec: ReplicaSpec, timeout_s: float) -> Client:
    if spec.kind == "openai":
        return OpenAIClient(spec, timeout_s)
    return ChatboxClient(spec, timeout_s)
