"""OpenAI's text completions (/v1/completions): a raw prompt, or several, without a chat
template; the same options, engine path and answer reading as chat completions."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from chatbox.chat import (
    DoneEvent,
    Generation,
    GenerationFailed,
    InvalidInput,
    TokenEvent,
    TurnOptions,
    Usage,
)
from chatbox.web.openai.answer import Choice, collect, finish_reasons, usage_out
from chatbox.web.openai.request import AnswerShape, extend_options

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for text completions
MAX_PROMPTS = 8
MAX_LOGPROBS = 5  # OpenAI's limit for text completions


@dataclass
class CompletionIn:
    prompt: str | list[Any]  # a string or strings; token ids are refused (`prompts`)
    model: str | None = None
    max_tokens: int | None = DEFAULT_MAX_TOKENS
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    logprobs: int | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    def prompts(self) -> list[str]:
        """The prompts, one answer set each; 400 naming `prompt` for anything else."""
        raw = self.prompt
        if isinstance(raw, str):
            return [raw]
        if isinstance(raw, list) and raw and all(isinstance(p, str) for p in raw):
            if len(raw) > MAX_PROMPTS:
                raise InvalidInput(f"prompt may hold at most {MAX_PROMPTS} strings", "prompt")
            return list(raw)
        if isinstance(raw, list) and raw and all(isinstance(p, int | list) for p in raw):
            # Engines (remote ones too) take text; ids decoded and tokenized again need not
            # be the same ids, so the model would not see the prompt that was sent.
            raise InvalidInput(
                "prompt as token ids is not supported by this server: send the text", "prompt"
            )
        raise InvalidInput("prompt must be a string or a non-empty list of strings", "prompt")

    def options(self, default_max_tokens: int) -> tuple[TurnOptions, AnswerShape]:
        if self.echo:
            raise InvalidInput("echo is not supported by this server", "echo")
        if self.suffix is not None:
            raise InvalidInput("suffix is not supported by this server", "suffix")
        if self.best_of is not None and self.best_of != (self.n or 1):
            raise InvalidInput("best_of is not supported by this server (other than n)", "best_of")
        k = self.logprobs
        if k is not None and not 0 <= k <= MAX_LOGPROBS:
            raise InvalidInput(f"logprobs must be between 0 and {MAX_LOGPROBS}", "logprobs")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        base = TurnOptions(
            self.model, self.temperature, self.top_p, self.max_tokens, self.seed, stop
        )
        values = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "n": self.n,
            "logprobs": k is not None,
            "top_logprobs": k,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "logit_bias": self.logit_bias,
            "user": self.user,
        }
        return extend_options(base, values, default_max_tokens)


def text_logprobs(entries: Sequence[dict[str, Any]], offset: int = 0) -> dict[str, Any]:
    """Chat-shaped logprob entries in the text completions' shape (parallel lists)."""
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e["token"])
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
        "text_offset": offsets,
    }


def add_usage(total: Usage, more: Usage) -> Usage:
    return Usage(
        total.prompt_tokens + more.prompt_tokens,
        total.completion_tokens + more.completion_tokens,
        total.cached_tokens + more.cached_tokens,
    )


async def collect_text(
    generations: Sequence[Generation], shape: AnswerShape
) -> tuple[list[dict[str, Any]], Usage]:
    """Every prompt's answers, read together: OpenAI's text `choices` and the usage."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(collect(g, shape)) for g in generations]
    except* GenerationFailed as failed:
        raise failed.exceptions[0] from None
    out: list[dict[str, Any]] = []
    usage = Usage()
    for p, task in enumerate(tasks):
        choices, used = task.result()
        usage = add_usage(usage, used)
        for c in choices:
            lp = c["logprobs"]
            out.append(
                {
                    "text": c["message"]["content"],
                    "index": p * shape.n + c["index"],
                    "logprobs": text_logprobs(lp["content"]) if lp is not None else None,
                    "finish_reason": c["finish_reason"],
                }
            )
    return out, usage


async def text_chunks(
    generations: Sequence[Generation],
    top: dict[str, Any],
    include_usage: bool,
    shape: AnswerShape,
) -> AsyncIterator[bytes]:
    """The answers as OpenAI's text completion chunks (each prompt's in turn, all running
    at once), ending with `data: [DONE]`."""

    def frame(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        body = {**top, "choices": choices, **extra}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n".encode()

    usage = Usage()
    try:
        for p, generation in enumerate(generations):
            choices = [Choice(i, shape) for i in range(shape.n)]
            offsets = [0] * shape.n
            done: DoneEvent | None = None
            async for event in generation:
                if isinstance(event, TokenEvent):
                    choice = choices[event.index]
                    out = bytearray()
                    for token in event.parts or (event,):
                        for delta in choice.feed(token):
                            sent = choice.take_logprobs()
                            lp = None
                            if sent is not None:
                                lp = text_logprobs(sent["content"], offsets[choice.index])
                            offsets[choice.index] += len(delta["content"])
                            index = p * shape.n + choice.index
                            one = {"text": delta["content"], "index": index, "logprobs": lp}
                            out += frame([{**one, "finish_reason": None}])
                    if out:
                        yield bytes(out)
                elif isinstance(event, DoneEvent):
                    done = event
            if done is None or done.finish_reason == "error":
                message = done.error if done is not None and done.error else "generation failed"
                error = {"error": {"message": message, "type": "server_error"}}
                yield f"data: {json.dumps(error)}\n\n".encode()
                break
            usage = add_usage(usage, done.usage)
            for choice, reason in zip(choices, finish_reasons(done, shape.n), strict=True):
                index = p * shape.n + choice.index
                last = {"text": "", "index": index, "logprobs": None}
                yield frame([{**last, "finish_reason": choice.finish_reason(reason)}])
        else:
            if include_usage:
                yield frame([], usage=usage_out(usage))
        yield b"data: [DONE]\n\n"
    finally:
        for generation in generations:
            generation.cancel()  # a client that disconnects stops every prompt's answers
