"""Stateless completions (the OpenAI-compatible API): admitted and metered, never stored."""

from __future__ import annotations

import asyncio
import hashlib
import json

from chatbox.chat.admission import Gatekeeper, Ticket
from chatbox.chat.errors import InvalidInput, Overloaded, Refused, TooLong
from chatbox.chat.models import ModelProvider, resolve_model
from chatbox.chat.moderated import ModeratedGeneration, screen_messages
from chatbox.chat.options import TurnOptions
from chatbox.chat.stateless.metered import MeteredGeneration
from chatbox.engine.types import (
    ChatMessage,
    ContextOverflowError,
    Engine,
    EngineBusyError,
    Generation,
    GenerationRequest,
    GrammarError,
    answer_room,
)
from chatbox.moderation import ModerationService
from chatbox.store import User


def submit(
    engine: Engine,
    request: GenerationRequest,
    retry_after_s: int,
    grammar_param: str = "response_format",
) -> Generation:
    """engine.submit, with the engine's refusals as the chat layer's errors; a grammar
    refused is blamed on `grammar_param`, the request parameter it was built from."""
    try:
        return engine.submit(request)
    except ContextOverflowError as exc:
        param = "prompt" if request.prompt is not None else None
        raise TooLong(exc.prompt_tokens, exc.limit, param) from exc
    except EngineBusyError as exc:
        raise Overloaded(str(exc), retry_after_s) from exc
    except GrammarError as exc:
        raise InvalidInput(f"{grammar_param}: {exc}", grammar_param) from exc


def opening_key(scope: str, messages: tuple[ChatMessage, ...]) -> str:
    """A cache key for a stateless completion: its user and the conversation's opening (the
    messages up to the first user message), which every follow-up call sends again, so a
    follow-up finds the KV its previous call left, also once that was parked. Two chats of
    one user that open alike share a key; the prefix match keeps that correct."""
    head: list[tuple[str, str]] = []
    for m in messages:
        head.append((m.role, m.content))
        if m.role == "user":
            break
    digest = hashlib.sha256(json.dumps([scope, head]).encode()).hexdigest()[:32]
    return f"openai:{digest}"


async def request_fits(engine: Engine, request: GenerationRequest) -> None:
    """TooLong where the engine would refuse the request for its size: its prompt with its
    tools' descriptions must leave the engine's room for an answer (counted in a thread)."""
    tokens = await asyncio.to_thread(engine.count_tokens, request.messages, request.tools)
    limit = engine.info.n_ctx_per_seq
    if tokens + answer_room(request.sampling.max_tokens) > limit:
        raise TooLong(tokens, limit)


def check_fits(engine: Engine, tokens: int) -> None:
    """A prompt must leave room for at least one answer token."""
    limit = engine.info.n_ctx_per_seq
    if tokens >= limit:
        raise TooLong(tokens, limit)


async def complete(
    models: ModelProvider,
    gate: Gatekeeper,
    max_tokens: int,
    messages: tuple[ChatMessage, ...],
    options: TurnOptions,
    user: User | None = None,
    moderation: ModerationService | None = None,
    zero_retention: bool = False,
    ticket: Ticket | None = None,
    prompt: str | None = None,
) -> tuple[str, Generation, int]:
    """A stateless completion (the OpenAI-compatible API): model name, stream, prompt size.

    With a user, it is admitted first (quotas, routing, overload) and its usage recorded;
    then moderated: what is new in the messages before any model work (the rest of a long
    history or message beside generation), the answer as it streams. Under `zero_retention`
    its KV has no key and is never parked (the engine drops it when the answer ends), and a
    review item keeps category and scores only. `ticket`: the user's request, admitted
    already (the answer cache admits before it looks).

    A raw `prompt` (/v1/completions) is sent as it is, without the chat template; `messages`
    is then ignored and the prompt is admitted and moderated as one user message. Its size
    is checked by the engine as it is submitted (0 is returned for it).
    """
    if prompt is not None:
        messages = (ChatMessage("user", prompt),)
    if not messages:
        raise InvalidInput("messages must not be empty")
    sampling = options.sampling(max_tokens)
    if ticket is not None:
        model = ticket.model
    elif user is not None:
        text = "\n".join(m.content for m in messages)
        ticket = await gate.admit(user, options.model, text, options.n)
        model = ticket.model
    else:
        model = resolve_model(models, options.model)
    screening = None
    try:
        engine = await models.engine(model)
        tokens = 0
        if prompt is None:  # a prompt too long is refused before it costs moderation
            # Tokenizing a long prompt is CPU work: in a thread, so the loop keeps serving.
            tokens = await asyncio.to_thread(engine.count_tokens, messages)
            check_fits(engine, tokens)
        if user is not None:  # after the rate limits, before any model work
            texts = [m.content for m in messages]
            screening = await screen_messages(moderation, user, texts, zero_retention)
        # A raw prompt's next call is a longer prompt, not a follow-up: no KV kept for it.
        keyed = user is not None and not zero_retention and prompt is None
        priority = ticket.priority if ticket else 0
        generation = submit(
            engine,
            GenerationRequest(
                messages,
                sampling,
                priority=priority,
                cache_scope=user.id if user else None,
                cache_key=opening_key(user.id, messages) if user and keyed else None,
                tools=options.tools,
                n=options.n,
                persist=not zero_retention,
                prompt=prompt,
            ),
            gate.policy.overload.retry_after_s,
            options.grammar_param,
        )
    except BaseException as exc:
        if ticket:  # nothing ran: give the admission back
            if isinstance(exc, Refused):
                ticket.outcome = "refused"
            await ticket.finish(None)
        raise
    if ticket is not None:
        generation = MeteredGeneration(generation, ticket)
    if user is not None and moderation is not None and moderation.enabled:
        rest = screening.start_rest if screening is not None else None
        generation = ModeratedGeneration(
            generation,
            moderation,
            user,
            rest,
            unsaved=zero_retention,
            screened=screening.verdict if screening is not None else None,
        )
    return model, generation, tokens
