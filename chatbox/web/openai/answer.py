"""Writing an OpenAI chat completion back: n choices, tool calls (streamed as
`delta.tool_calls[i].function.arguments` pieces), logprobs, usage."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from chatbox.chat import DoneEvent, Generation, GenerationFailed, TokenEvent, Usage
from chatbox.chat.stateless.structured import CallReader, Piece
from chatbox.engine.types import TokenLogprob
from chatbox.web.openai.request import AnswerShape


def usage_out(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def _token(piece: bytes, logprob: float) -> dict[str, Any]:
    return {"token": piece.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(piece)}


def logprob_out(lp: TokenLogprob, k: int) -> dict[str, Any]:
    return {**_token(lp.piece, lp.logprob), "top_logprobs": [_token(p, q) for p, q in lp.top[:k]]}


class Choice:
    """One of the n answers as it is read: content, tool calls, logprobs."""

    def __init__(self, index: int, shape: AnswerShape) -> None:
        self.index = index
        self.shape = shape
        self.reader = CallReader() if shape.tool_mode != "none" else None
        self.text: list[str] = []
        self.logprobs: list[dict[str, Any]] = []
        self._unsent: list[dict[str, Any]] = []  # logprobs not yet on a streamed chunk
        self._held: list[Piece] = []  # a second or later call, until its arguments are whole

    def feed(self, event: TokenEvent) -> list[dict[str, Any]]:
        """Deltas for one token event."""
        if self.shape.logprobs:
            entries = [logprob_out(lp, self.shape.top_logprobs) for lp in event.logprobs]
            self.logprobs += entries
            self._unsent += entries
        if self.reader is None:
            self.text.append(event.text)
            return [{"content": event.text}]
        if self.reader.repeated:
            return []
        out = []
        for p in self.reader.feed(event.text):
            if p.kind == "repeat":  # the repeated call is never sent
                self._held.clear()
                break
            if p.kind == "end":
                out += [_delta(h) for h in self._held]
                self._held.clear()
            elif p.kind != "content" and p.index > 0:
                self._held.append(p)  # sent once it is whole and not a repeat
            else:
                out.append(_delta(p))
        return out

    @property
    def ended(self) -> bool:
        """The model repeated a call: nothing it writes after that is read."""
        return self.reader is not None and self.reader.repeated

    def finish(self) -> list[dict[str, Any]]:
        if self.reader is None or self.reader.repeated:
            return []
        held, self._held = self._held, []  # a last call cut by max_tokens, as it stands
        return [_delta(p) for p in [*held, *self.reader.finish()]]

    def take_logprobs(self) -> dict[str, Any] | None:
        if not self.shape.logprobs:
            return None
        sent, self._unsent = self._unsent, []
        return {"content": sent}

    def finish_reason(self, reason: str) -> str:
        if reason == "content_filter" or (reason == "length" and not self.ended):
            return reason  # content_filter: moderation cut it; a repeat ended it before any cut
        return "tool_calls" if self.reader is not None and self.reader.calls else "stop"

    def message(self) -> dict[str, Any]:
        if self.reader is None:
            return {"role": "assistant", "content": "".join(self.text)}
        calls = self.reader.calls
        content = self.reader.content
        out: dict[str, Any] = {
            "role": "assistant",
            "content": content if content or not calls else None,
        }
        if calls:
            out["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in calls
            ]
        return out


def _delta(piece: Piece) -> dict[str, Any]:
    if piece.kind == "content":
        return {"content": piece.text}
    if piece.kind == "call":
        call = {
            "index": piece.index,
            "id": piece.call_id,
            "type": "function",
            "function": {"name": piece.name, "arguments": ""},
        }
        return {"tool_calls": [call]}
    return {"tool_calls": [{"index": piece.index, "function": {"arguments": piece.text}}]}


def finish_reasons(done: DoneEvent, n: int) -> list[str]:
    return list(done.finish_reasons) if len(done.finish_reasons) == n else [done.finish_reason] * n


async def collect(generation: Generation, shape: AnswerShape) -> tuple[list[dict[str, Any]], Usage]:
    """The whole answer: OpenAI's `choices` and the usage."""
    choices = [Choice(i, shape) for i in range(shape.n)]
    done: DoneEvent | None = None
    try:
        async for event in generation:
            if isinstance(event, TokenEvent):
                choices[event.index].feed(event)
                if shape.n == 1 and choices[0].ended:
                    generation.cancel()  # ends with a DoneEvent (usage so far)
            elif isinstance(event, DoneEvent):
                done = event
    finally:
        generation.cancel()  # no-op once finished; frees the slot if the client left
    if done is None or done.finish_reason == "error":
        raise GenerationFailed(done.error if done and done.error else "generation failed")
    out = []
    for choice, reason in zip(choices, finish_reasons(done, shape.n), strict=True):
        choice.finish()
        body: dict[str, Any] = {
            "index": choice.index,
            "finish_reason": choice.finish_reason(reason),
            "message": choice.message(),
        }
        body["logprobs"] = {"content": choice.logprobs} if shape.logprobs else None
        out.append(body)
    return out, done.usage


async def chunks(
    generation: Generation,
    ident: str,
    created: int,
    model: str,
    include_usage: bool,
    shape: AnswerShape,
    system_fingerprint: str,
) -> AsyncIterator[bytes]:
    """The answer as OpenAI's SSE chunks, ending with `data: [DONE]`."""
    top = {
        "id": ident,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": system_fingerprint,
    }

    def frame(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        body = {**top, "choices": choices, **extra}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n".encode()

    # Most chunks carry one token's text and nothing else: their JSON is written as the fixed
    # head and that text, not encoded whole each time (this runs once per token on the event
    # loop the decode threads share the cores with). The bytes are what frame() writes.
    head = json.dumps(top, ensure_ascii=False)[:-1]

    def text_chunk(index: int, text: str) -> bytes:
        content = json.dumps(text, ensure_ascii=False)
        return (
            f'data: {head}, "choices": [{{"index": {index}, "delta": {{"content": {content}}}, '
            f'"finish_reason": null}}]}}\n\n'
        ).encode()

    def one(choice: Choice, delta: dict[str, Any], finish: str | None) -> bytes:
        body: dict[str, Any] = {"index": choice.index, "delta": delta, "finish_reason": finish}
        if shape.logprobs:
            body["logprobs"] = choice.take_logprobs()
        return frame([body])

    choices = [Choice(i, shape) for i in range(shape.n)]
    done: DoneEvent | None = None
    try:
        for choice in choices:
            yield frame(
                [
                    {
                        "index": choice.index,
                        # A tool-call answer may have no content at all: OpenAI sends null.
                        "delta": {
                            "role": "assistant",
                            "content": "" if choice.reader is None else None,
                        },
                        "finish_reason": None,
                    }
                ]
            )
        async for event in generation:
            if isinstance(event, TokenEvent):
                # One chunk per token, as OpenAI sends them; the tokens that reached this
                # loop together (`parts`) go out in one write, which is where the cost is.
                choice = choices[event.index]
                out = bytearray()
                for token in event.parts or (event,):
                    for delta in choice.feed(token):
                        if not shape.logprobs and delta.keys() == {"content"}:
                            out += text_chunk(choice.index, delta["content"])
                        else:
                            out += one(choice, delta, None)
                if out:
                    yield bytes(out)
                if shape.n == 1 and choice.ended:
                    generation.cancel()  # ends with a DoneEvent (usage so far)
            elif isinstance(event, DoneEvent):
                done = event
        if done is None or done.finish_reason == "error":
            message = done.error if done is not None and done.error else "generation failed"
            error = {"error": {"message": message, "type": "server_error"}}
            yield f"data: {json.dumps(error)}\n\n".encode()
        else:
            for choice, reason in zip(choices, finish_reasons(done, shape.n), strict=True):
                for delta in choice.finish():
                    yield one(choice, delta, None)
                yield one(choice, {}, choice.finish_reason(reason))
            if include_usage:
                yield frame([], usage=usage_out(done.usage))
        yield b"data: [DONE]\n\n"
    finally:
        generation.cancel()  # a client that disconnects stops its generation
