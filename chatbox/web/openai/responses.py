"""OpenAI's Responses API: `POST /v1/responses` on the chat completions path (the same
admission, moderation, zero retention, tools and structured output), its `response.*`
events when streamed, and `GET`/`DELETE /v1/responses/{id}` of the user's kept responses."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from litestar import Controller, Response, delete, get, post
from litestar.openapi import ResponseSpec
from litestar.response import Stream

from chatbox.chat import ChatMessage, DoneEvent, Generation, InvalidInput, TokenEvent, TurnOptions
from chatbox.chat.stateless.responses import (
    Echo,
    ResponseLog,
    call_item,
    chat_parameters,
    echo_of,
    input_messages,
    message_item,
    new_id,
    output_items,
    renamed,
    response_object,
    status_of,
)
from chatbox.chat.stateless.structured import off_loop
from chatbox.web.deps import ChatDep, DataServiceDep, SettingsDep, UserDep
from chatbox.web.errors import ERROR_RESPONSES, OPENAI_EXCEPTION_HANDLERS
from chatbox.web.openai.answer import Choice, collect
from chatbox.web.openai.api import _route_headers
from chatbox.web.openai.request import AnswerShape, extend_options
from chatbox.web.openai.schemas import ResponseDeletedOut, ResponseOut
from chatbox.web.sse import SSE_HEADERS, with_heartbeats


@dataclass
class ResponsesIn:
    input: str | list[dict[str, Any]] | None = None
    model: str | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    # Asked of OpenAI's own models; refused where they would change the answer.
    reasoning: dict[str, Any] | None = None
    background: bool | None = None
    top_logprobs: int | None = None
    # Accepted and not acted on: nothing here changes what the model is asked.
    include: list[str] | None = None
    truncation: str | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None

    def values(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def options(self, default_max_tokens: int) -> tuple[TurnOptions, AnswerShape]:
        base = TurnOptions(self.model, self.temperature, self.top_p, self.max_output_tokens)
        try:
            return extend_options(base, chat_parameters(self.values()), default_max_tokens)
        except InvalidInput as exc:
            raise renamed(exc) from None


class ResponsesController(Controller):
    path = "/v1/responses"
    tags = ["openai"]
    exception_handlers = OPENAI_EXCEPTION_HANDLERS

    @post(
        "/",
        status_code=200,
        responses={200: ResponseSpec(ResponseOut, description="The response"), **ERROR_RESPONSES},
    )
    async def create(
        self,
        chat: ChatDep,
        settings: SettingsDep,
        user: UserDep,
        data: ResponsesIn,
        data_service: DataServiceDep,
    ) -> Response[Any] | Stream:
        """A model response (OpenAI's `client.responses.create`); kept for
        `previous_response_id` and `GET` unless `store` is false or the user's data rules
        keep nothing."""
        if data.input is None:
            raise InvalidInput("input is required", "input")
        log = ResponseLog(chat.store, chat.gate.policy)
        conversation = input_messages(data.input)
        if data.previous_response_id is not None:
            conversation = await log.history(user, data.previous_response_id) + conversation
        first = [ChatMessage("system", data.instructions)] if data.instructions else []
        messages = (*first, *conversation)
        if data.tools or data.text:
            options, shape = await off_loop(lambda: data.options(settings.max_tokens))
        else:
            options, shape = data.options(settings.max_tokens)
        zdr = await data_service.stores_nothing(user)
        keep = await log.keeps(user, data.store is not False)
        model, generation, _ = await chat.complete(messages, options, user, zero_retention=zdr)
        headers = {**chat.limit_headers(user), "x-chatbox-model": model}
        headers.update(_route_headers(getattr(generation, "ticket", None)))
        sampling = options.sampling(settings.max_tokens)
        echo = echo_of(data.values(), sampling.temperature, sampling.top_p, keep)
        response_id, created = new_id("resp"), int(time.time())

        async def kept(body: dict[str, Any]) -> None:
            if keep and body["status"] != "failed":
                await log.keep(user, body, conversation)

        if data.stream:
            body = events(generation, shape, response_id, created, model, echo, kept)
            return Stream(
                with_heartbeats(body, settings.heartbeat_s),
                media_type="text/event-stream",
                headers={**SSE_HEADERS, **headers},
            )
        choices, usage = await collect(generation, shape)
        status, incomplete = status_of(choices[0]["finish_reason"])
        output = output_items(choices[0]["message"])
        answer = response_object(
            response_id, created, model, echo, status, output, usage, incomplete
        )
        await kept(answer)
        return Response(answer, headers=headers)

    @get(
        "/{response_id:str}",
        responses={200: ResponseSpec(ResponseOut, description="The response"), **ERROR_RESPONSES},
    )
    async def read(self, chat: ChatDep, user: UserDep, response_id: str) -> Response[Any]:
        """One of the user's kept responses (404 for any other id)."""
        body = await ResponseLog(chat.store, chat.gate.policy).get(user, response_id)
        return Response(body)

    @delete("/{response_id:str}", status_code=200, responses=ERROR_RESPONSES)
    async def forget(self, chat: ChatDep, user: UserDep, response_id: str) -> ResponseDeletedOut:
        """Delete one of the user's kept responses."""
        await ResponseLog(chat.store, chat.gate.policy).delete(user, response_id)
        return ResponseDeletedOut(response_id, "response", True)


async def events(
    generation: Generation,
    shape: AnswerShape,
    response_id: str,
    created: int,
    model: str,
    echo: Echo,
    kept: Callable[[dict[str, Any]], Awaitable[None]],
) -> AsyncIterator[bytes]:
    """The answer as the Responses API's events: created, in_progress, each output item
    (added, its text or arguments in deltas, done), then completed (incomplete, failed)."""
    sequence = 0

    def frame(kind: str, **fields: Any) -> bytes:
        nonlocal sequence
        body = {"type": kind, "sequence_number": sequence, **fields}
        sequence += 1
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n".encode()

    def snapshot(status: str = "in_progress", **more: Any) -> dict[str, Any]:
        return response_object(response_id, created, model, echo, status, **more)

    items: list[dict[str, Any]] = []  # finished output items
    current: dict[str, Any] | None = None  # the item being written

    def close() -> list[bytes]:
        nonlocal current
        if current is None:
            return []
        item, index, current = current, len(items), None
        if item["type"] == "message":
            text = item.pop("text")
            done = message_item(item["id"], text)
            part = done["content"][0]
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            out = [
                frame("response.output_text.done", **where, text=text, logprobs=[]),
                frame("response.content_part.done", **where, part=part),
            ]
        else:
            done = call_item(item["id"], item["call_id"], item["name"], item["arguments"])
            out = [
                frame(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            ]
        items.append(done)
        return [*out, frame("response.output_item.done", output_index=index, item=done)]

    def open_message() -> list[bytes]:
        nonlocal current
        out = close()
        item_id, index = new_id("msg"), len(items)
        current = {"type": "message", "id": item_id, "text": ""}
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            *out,
            frame(
                "response.output_item.added",
                output_index=index,
                item=message_item(item_id, "", "in_progress"),
            ),
            frame(
                "response.content_part.added",
                item_id=item_id,
                output_index=index,
                content_index=0,
                part=part,
            ),
        ]

    def step(delta: dict[str, Any]) -> list[bytes]:
        nonlocal current
        out: list[bytes] = []
        if delta.get("content"):
            if current is None or current["type"] != "message":
                out += open_message()
            assert current is not None
            current["text"] += delta["content"]
            out.append(
                frame(
                    "response.output_text.delta",
                    item_id=current["id"],
                    output_index=len(items),
                    content_index=0,
                    delta=delta["content"],
                    logprobs=[],
                )
            )
        for call in delta.get("tool_calls") or ():
            if "id" in call:  # a call starts
                out += close()
                fn = call["function"]
                current = {
                    "type": "function_call",
                    "id": new_id("fc"),
                    "call_id": call["id"],
                    "name": fn["name"],
                    "arguments": "",
                }
                item = call_item(current["id"], call["id"], fn["name"], "", "in_progress")
                out.append(frame("response.output_item.added", output_index=len(items), item=item))
            elif current is not None and current["type"] == "function_call":
                piece = call["function"]["arguments"]
                current["arguments"] += piece
                out.append(
                    frame(
                        "response.function_call_arguments.delta",
                        item_id=current["id"],
                        output_index=len(items),
                        delta=piece,
                    )
                )
        return out

    choice = Choice(0, shape)
    done: DoneEvent | None = None
    try:
        yield frame("response.created", response=snapshot())
        yield frame("response.in_progress", response=snapshot())
        async for event in generation:
            if isinstance(event, TokenEvent):
                out: list[bytes] = []
                for token in event.parts or (event,):
                    for delta in choice.feed(token):
                        out += step(delta)
                if out:
                    yield b"".join(out)
                if choice.ended:
                    generation.cancel()  # ends with a DoneEvent (usage so far)
            elif isinstance(event, DoneEvent):
                done = event
        if done is None or done.finish_reason == "error":
            message = done.error if done is not None and done.error else "generation failed"
            error = {"code": "server_error", "message": message}
            yield frame("response.failed", response=snapshot("failed", output=items, error=error))
            return
        tail: list[bytes] = []
        for delta in choice.finish():
            tail += step(delta)
        if current is None and not items:  # an empty answer is an empty message
            tail += open_message()
        tail += close()
        yield b"".join(tail)
        status, incomplete = status_of(choice.finish_reason(done.finish_reason))
        final = snapshot(status, output=items, usage=done.usage, incomplete=incomplete)
        await kept(final)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        yield frame(kind, response=final)
    finally:
        generation.cancel()  # a client that disconnects stops its generation
