"""The OpenAI-compatible API: /v1/chat/completions, /v1/completions and /v1/models,
stateless."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from litestar import Controller, Response, get, post
from litestar.openapi import ResponseSpec
from litestar.response import Stream
from msgspec import Struct

from chatbox import __version__
from chatbox.chat import ChatMessage, Generation, TurnOptions, UnknownModel
from chatbox.chat.stateless.structured import off_loop
from chatbox.engine.types import ModelInfo
from chatbox.web.api.knowledge import EMBEDDING_MODEL
from chatbox.web.auth import AnyRequest
from chatbox.web.deps import ChatDep, DataServiceDep, SettingsDep, UserDep
from chatbox.web.errors import ERROR_RESPONSES, OPENAI_EXCEPTION_HANDLERS
from chatbox.web.intake import NonEmptyObjects
from chatbox.web.openai.answer import chunks, collect, usage_out
from chatbox.web.openai.request import AnswerShape, extend_options, messages_in
from chatbox.web.openai.schemas import ChatCompletionOut, TextCompletionOut
from chatbox.web.openai.text import CompletionIn, collect_text, text_chunks
from chatbox.web.sse import SSE_HEADERS, with_heartbeats


class ModelKind(Struct):
    kind: str  # "chat" or "embedding"


class ModelOut(Struct):
    id: str
    object: str
    created: int
    owned_by: str
    chatbox: ModelKind

    @classmethod
    def of(cls, name: str, kind: str = "chat") -> ModelOut:
        return cls(name, "model", 0, "chatbox", ModelKind(kind))


class ModelsOut(Struct):
    object: str
    data: list[ModelOut]


def fingerprint(info: ModelInfo) -> str:
    """`system_fingerprint`: changes when the model, its file or the chatbox version does."""
    identity = f"{info.name}\0{info.path}\0{info.architecture}\0{__version__}"
    digest = hashlib.sha256(identity.encode()).hexdigest()
    return "fp_" + digest[:10]


@dataclass
class ChatCompletionIn:
    messages: NonEmptyObjects
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int | None = 1
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # Known to OpenAI, not implemented here: a 400 naming them unless unset (openai/request.py).
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    prediction: Any = None
    web_search_options: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    store: Any = None
    metadata: Any = None
    modalities: Any = None
    service_tier: Any = None

    def to_messages(self) -> tuple[ChatMessage, ...]:
        return messages_in(self.messages)

    def options(self, default_max_tokens: int = 512) -> tuple[TurnOptions, AnswerShape]:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        base = TurnOptions(
            self.model,
            self.temperature,
            self.top_p,
            self.max_completion_tokens or self.max_tokens,
            self.seed,
            stop,
        )
        # shallow: asdict would deep-copy (and recurse through) every schema in the request
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return extend_options(base, values, default_max_tokens)


class OpenAIController(Controller):
    path = "/v1"
    tags = ["openai"]
    exception_handlers = OPENAI_EXCEPTION_HANDLERS

    @get("/models")
    async def models(self, chat: ChatDep, user: UserDep) -> ModelsOut:
        """The models this user may pick, plus "auto" (routing by the request's shape)."""
        chat_models = [ModelOut.of(n) for n in [*chat.models.names(), "auto"]]
        return ModelsOut("list", [*chat_models, ModelOut.of(EMBEDDING_MODEL, "embedding")])

    @get("/models/{model_id:str}", responses=ERROR_RESPONSES)
    async def model(self, chat: ChatDep, user: UserDep, model_id: str) -> ModelOut:
        """One model this user may pick (404 `model_not_found` for any other id)."""
        names = chat.models.names()
        if model_id == EMBEDDING_MODEL:
            return ModelOut.of(model_id, "embedding")
        if model_id not in [*names, "auto"]:
            raise UnknownModel(model_id, names)
        return ModelOut.of(model_id)

    @post(
        "/chat/completions",
        status_code=200,
        responses={200: ResponseSpec(ChatCompletionOut, description="The answer")},
    )
    async def completions(
        self,
        chat: ChatDep,
        settings: SettingsDep,
        user: UserDep,
        data: ChatCompletionIn,
        request: AnyRequest,
        data_service: DataServiceDep,
    ) -> Response[Any] | Stream:
        messages = data.to_messages()
        if data.tools or data.response_format:
            options, shape = await off_loop(lambda: data.options(settings.max_tokens))
        else:  # no grammar to build: a thread hop would cost more than the parsing
            options, shape = data.options(settings.max_tokens)
        if not data.stream:
            return await self._whole(chat, user, data, messages, options, shape)
        zdr = await data_service.stores_nothing(user)
        model, generation, _ = await chat.complete(messages, options, user, zero_retention=zdr)
        headers = {**chat.limit_headers(user), "x-chatbox-model": model}
        headers.update(_route_headers(getattr(generation, "ticket", None)))
        ident = "chatcmpl-" + secrets.token_hex(12)
        created = int(time.time())
        include_usage = bool((data.stream_options or {}).get("include_usage"))
        engine = await chat.models.engine(model)
        body = chunks(
            generation, ident, created, model, include_usage, shape, fingerprint(engine.info)
        )
        return Stream(
            with_heartbeats(body, settings.heartbeat_s),
            media_type="text/event-stream",
            headers={**SSE_HEADERS, **headers},
        )

    @post(
        "/completions",
        status_code=200,
        responses={200: ResponseSpec(TextCompletionOut, description="The answers")},
    )
    async def text_completions(
        self,
        chat: ChatDep,
        settings: SettingsDep,
        user: UserDep,
        data: CompletionIn,
        data_service: DataServiceDep,
    ) -> Response[Any] | Stream:
        """Text completions: each prompt as it is, without the chat template; admitted,
        moderated and metered per prompt as a chat completion is."""
        prompts = data.prompts()
        options, shape = await off_loop(lambda: data.options(settings.max_tokens))
        zdr = await data_service.stores_nothing(user)
        generations: list[Generation] = []
        model = ""
        try:
            for prompt in prompts:
                model, generation, _ = await chat.complete(
                    (), options, user, zero_retention=zdr, prompt=prompt, prompts=len(prompts)
                )
                generations.append(generation)
        except BaseException:
            for started in generations:
                started.cancel()
            raise
        headers = {**chat.limit_headers(user), "x-chatbox-model": model}
        headers.update(_route_headers(getattr(generations[0], "ticket", None)))
        engine = await chat.models.engine(model)
        top = {
            "id": "cmpl-" + secrets.token_hex(12),
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": fingerprint(engine.info),
        }
        if data.stream:
            include_usage = bool((data.stream_options or {}).get("include_usage"))
            body = text_chunks(generations, top, include_usage, shape)
            return Stream(
                with_heartbeats(body, settings.heartbeat_s),
                media_type="text/event-stream",
                headers={**SSE_HEADERS, **headers},
            )
        choices, usage = await collect_text(generations, shape)
        return Response({**top, "choices": choices, "usage": usage_out(usage)}, headers=headers)

    async def _whole(
        self,
        chat: ChatDep,
        user: UserDep,
        data: ChatCompletionIn,
        messages: tuple[ChatMessage, ...],
        options: TurnOptions,
        shape: AnswerShape,
    ) -> Response[Any]:
        """A whole answer; a deterministic request's through the answer cache, whose hit is
        the body first sent, byte for byte, with `x-chatbox-cache: hit`."""
        request = {f.name: getattr(data, f.name) for f in dataclasses.fields(data)}
        exact = await chat.complete_exact(messages, options, user, request)
        headers = {**chat.limit_headers(user), "x-chatbox-model": exact.model}
        headers.update(_route_headers(exact.ticket or getattr(exact.generation, "ticket", None)))
        if exact.body is not None:
            headers["x-chatbox-cache"] = "hit"
            return Response(exact.body, media_type="application/json", headers=headers)
        assert exact.generation is not None
        choices, usage = await collect(exact.generation, shape)
        engine = await chat.models.engine(exact.model)
        answer = {
            "id": "chatcmpl-" + secrets.token_hex(12),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": exact.model,
            "system_fingerprint": fingerprint(engine.info),
            "choices": choices,
            "usage": usage_out(usage),
        }
        if exact.key is None:
            return Response(answer, headers=headers)
        body = json.dumps(answer, ensure_ascii=False, separators=(",", ":")).encode()
        kept = chat.keep_answer(exact, user, body, usage)
        headers["x-chatbox-cache"] = "miss" if kept else "miss, not kept"
        return Response(body, media_type="application/json", headers=headers)


def _route_headers(ticket: Any) -> dict[str, str]:
    """How admission routed the request (reason, degraded from, canary arm)."""
    route = getattr(ticket, "route", None)
    if route is None:
        return {}
    headers = {"x-chatbox-route": route.reason}
    if route.degraded_from:
        headers["x-chatbox-degraded-from"] = route.degraded_from
    if route.arm:
        headers["x-chatbox-arm"] = route.arm
    return headers
