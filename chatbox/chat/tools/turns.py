"""The tool loop of a stored answer: the model's calls read out of its stream, each call and
its result appended as turns of their own (under the answer's draft), then the model asked
again with the results, until it answers without a call or the turn's tool budget is spent.

Tool-call text never reaches the answer: `CallFilter` relays the content only. Stop cancels
the running tool as it cancels generation (`ToolLoop.stop`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from chatbox.chat.admission import Ticket
from chatbox.chat.errors import InvalidInput, TooLong
from chatbox.chat.moderated import relay_answer
from chatbox.chat.options import TurnOptions
from chatbox.chat.policy import TierPolicy
from chatbox.chat.running.runs import TurnRun
from chatbox.chat.stateless.completions import request_fits, submit
from chatbox.chat.stateless.structured import CallReader, off_loop, tool_constraint
from chatbox.chat.tools.approval import ToolApprovals
from chatbox.chat.tools.base import Toolbox, ToolContext
from chatbox.chat.tools.loop import Budget, Step, ToolCache, ToolSession, gather_tools
from chatbox.engine.types import (
    ChatMessage,
    DoneEvent,
    Engine,
    EngineEvent,
    Generation,
    GenerationRequest,
    TokenEvent,
    ToolCall,
    Usage,
)
from chatbox.moderation import OutputWatch
from chatbox.store import Conversation, Turn, User

TOOL_CHOICES = ("auto", "none", "required")


@dataclass(frozen=True)
class ToolOffer:
    """What a user may turn on for a chat: up to `calls` tool calls an answer, the code
    interpreter among them where `code`."""

    calls: int
    code: bool


RESULT_CHARS = 2000  # of a result, the model reads this much (the turn keeps it whole)


def for_model(text: str) -> str:
    return text if len(text) <= RESULT_CHARS else text[:RESULT_CHARS] + " …(cut)"


class CallFilter:
    """The current pass's generation, relayed without its tool-call text."""

    def __init__(self, inner: Generation) -> None:
        self.inner = inner
        self.reader = CallReader()

    def start(self, inner: Generation) -> None:
        self.inner = inner
        self.reader = CallReader()

    def cancel(self) -> None:
        self.inner.cancel()

    async def __aiter__(self) -> AsyncIterator[EngineEvent]:
        async for event in self.inner:
            if isinstance(event, TokenEvent):
                text = "".join(p.text for p in self.reader.feed(event.text) if p.kind == "content")
                if text:
                    yield TokenEvent(text, event.index)
            else:
                if isinstance(event, DoneEvent):
                    rest = "".join(p.text for p in self.reader.finish() if p.kind == "content")
                    if rest:
                        yield TokenEvent(rest)
                yield event


# (a tool turn's role, its content) -> the stored turn
AppendTool = Callable[[Literal["tool_call", "tool_result"], str], Awaitable[Turn]]


@dataclass
class ToolLoop:
    """One answer's passes: the request to ask again with, the session, and the choice."""

    session: ToolSession
    request: GenerationRequest  # the first pass's (its messages grow by each pass's calls)
    submit: Callable[[GenerationRequest], Generation]
    fits: Callable[[GenerationRequest], Awaitable[None]]  # TooLong where it would be refused
    choice: str = "auto"  # auto | none | required
    forced: tuple[str, ...] = ()  # tools called first, one per pass, in order
    max_tokens: int = 512
    approvals: ToolApprovals | None = None  # where a call of a tool with side effects waits
    user: User | None = None  # the person the answer is for: the one who decides
    rounds: int = 0
    stopped: bool = False
    _task: asyncio.Task[Step] | None = None

    def stop(self) -> None:
        """Stop: the running tool is cancelled (its result says so); no pass follows."""
        self.stopped = True
        if self._task is not None:
            self._task.cancel()

    async def first(self) -> GenerationRequest:
        """The first pass's request; with no tools where their descriptions leave the
        prompt no room in the model's context (TooLong instead where tools are forced)."""
        return await self._constrained(self.request, strict=bool(self.forced))

    async def _constrained(
        self, request: GenerationRequest, strict: bool = False
    ) -> GenerationRequest:
        """The request with the tools offered now and the grammar for the next pass.

        The fit is checked here, before submitting, because a remote engine's refusal
        arrives only as its stream's end, too late to answer without the tools."""
        sampling = replace(request.sampling, grammar=None, grammar_triggers=())
        if self.choice == "none" or not self.session.open:
            return replace(request, tools=(), sampling=sampling)
        specs = self.session.specs()
        try:
            await self.fits(replace(request, tools=specs, sampling=sampling))
        except TooLong:
            if strict:
                raise
            return replace(request, tools=(), sampling=sampling)
        name = self.forced[self.rounds] if self.rounds < len(self.forced) else None
        if name is not None and name not in self.session.names():
            name = None
        mode = "required" if name is not None or self.choice == "required" else "auto"
        max_tokens = self.max_tokens

        def build() -> Any:
            return tool_constraint(specs, mode, name, max_tokens, parallel=False)  # type: ignore[arg-type]

        constraint = await off_loop(build)
        sampling = replace(
            sampling, grammar=constraint.grammar, grammar_triggers=constraint.triggers
        )
        return replace(request, tools=specs, sampling=sampling)

    def unoffered(self) -> GenerationRequest:
        """The next pass with no tool offered (their descriptions take no room): the
        model answers with the results it has."""
        sampling = replace(self.request.sampling, grammar=None, grammar_triggers=())
        return replace(self.request, tools=(), sampling=sampling)

    async def run_calls(
        self,
        calls: list[dict[str, Any]],
        content: str,
        append: AppendTool,
        publish: Callable[[str, dict[str, Any]], object],
    ) -> GenerationRequest | None:
        """Run one pass's calls in order (turns and events for each); the next pass's
        request, or None when stopped."""
        made: list[ToolCall] = []
        answers: list[ChatMessage] = []
        approvals, user, conv_id = self.approvals, self.user, self.session.context.conversation_id
        if approvals is not None and user is not None and conv_id is not None:

            async def approve(
                call_id: str, name: str, arguments: dict[str, Any], seconds: float
            ) -> str | None:
                assert approvals is not None and user is not None and conv_id is not None
                return await approvals.ask(
                    user, conv_id, call_id, name, arguments, seconds, publish
                )

            self.session.approve = approve
        for call in calls:
            if self.stopped or not self.session.open:
                break
            try:
                arguments = json.loads(call["arguments"] or "{}")
            except ValueError:
                arguments = call["arguments"]
            asked = {"id": call["id"], "name": call["name"], "arguments": arguments}
            call_turn = await append("tool_call", json.dumps(asked, ensure_ascii=False))
            publish("tool_call", {"turn_id": call_turn.id, **asked})
            self._task = asyncio.ensure_future(
                self.session.call(call["id"], call["name"], call["arguments"])
            )
            try:
                step = await self._task
            except asyncio.CancelledError:
                if not self.stopped:
                    raise
                step = self.session.cancelled(call["id"], call["name"], arguments)
            finally:
                self._task = None
            body = step.result_json()
            result_turn = await append("tool_result", json.dumps(body, ensure_ascii=False))
            publish("tool_result", {"turn_id": result_turn.id, **body})
            made.append(ToolCall(call["id"], call["name"], call["arguments"] or "{}"))
            answers.append(
                ChatMessage(
                    "tool", for_model(step.result.text), tool_call_id=call["id"], name=call["name"]
                )
            )
        if self.stopped or not made:
            return None
        self.rounds += 1
        said = ChatMessage("assistant", content, tool_calls=tuple(made))
        self.request = replace(self.request, messages=(*self.request.messages, said, *answers))
        return await self._constrained(self.request)


@dataclass
class ToolUsage:
    """Tokens of every pass of one answer, added up."""

    prompt: int = 0
    completion: int = 0
    cached: int = 0
    rounds: list[DoneEvent] = field(default_factory=list)

    def add(self, done: DoneEvent) -> None:
        self.prompt += done.usage.prompt_tokens
        self.completion += done.usage.completion_tokens
        self.cached += done.usage.cached_tokens
        self.rounds.append(done)


def tool_offer(toolboxes: Sequence[Toolbox], tier: TierPolicy) -> ToolOffer | None:
    """The tools a tier allows (None: none), for the composer's switch."""
    if not toolboxes or tier.tool_calls <= 0:
        return None
    return ToolOffer(tier.tool_calls, tier.code_interpreter)


async def tool_loop(
    toolboxes: Sequence[Toolbox],
    tier: TierPolicy,
    user: User,
    conv: Conversation,
    options: TurnOptions,
    request: GenerationRequest,
    engine: Engine,
    retry: int,
    results: ToolCache,
    keeps: Callable[[], Awaitable[bool]],
    approvals: ToolApprovals | None = None,
) -> ToolLoop | None:
    """The answer's tools (None: none offered), within the tier's budget; `keeps` says
    whether results may be stored (not under zero retention); a call of a tool with side
    effects waits in `approvals` for the user (none: it is refused)."""
    if options.tool_choice not in TOOL_CHOICES:
        raise InvalidInput(
            "tool_choice must be auto, none, required, or names of tools", "tool_choice"
        )
    wanted = options.tool_choice != "none" or options.force_tools
    if not toolboxes or tier.tool_calls <= 0 or not wanted:
        if options.force_tools:
            raise InvalidInput("no tools are offered to your tier", "tool_choice")
        return None
    context = ToolContext(
        user.id, conv.id, conv.workspace_id, time.monotonic() + tier.tool_seconds, user.tier
    )
    tools = await gather_tools(toolboxes, context)
    names = {t.spec.name for t in tools}
    unknown = [n for n in options.force_tools if n not in names]
    if unknown:
        raise InvalidInput(f"no tool named {unknown[0]!r} is offered here", "tool_choice")
    if not tools:
        return None
    session = ToolSession(
        tools,
        context,
        Budget(tier.tool_calls, float(tier.tool_seconds)),
        results,
        await keeps(),
    )
    return ToolLoop(
        session,
        request,
        lambda r: submit(engine, r, retry),
        lambda r: request_fits(engine, r),
        "auto" if options.tool_choice == "none" else options.tool_choice,
        options.force_tools,
        request.sampling.max_tokens,
        approvals,
        user,
    )


async def relay_with_tools(
    run: TurnRun,
    generation: Generation,
    ticket: Ticket,
    watch: OutputWatch | None,
    on_token: Callable[[], Awaitable[None]],
    rounds: ToolLoop | None,
    append: AppendTool,
) -> tuple[DoneEvent | None, str | None]:
    """The answer, pass after pass while the model calls tools (each call and result
    appended as a turn by `append`)."""
    if rounds is None or not isinstance(generation, CallFilter):
        return await relay_answer(run, generation, ticket, watch, on_token)
    total = ToolUsage()
    while True:
        done, error = await relay_answer(run, generation, ticket, watch, on_token)
        if done is not None:
            total.add(done)
        cut = watch is not None and watch.verdict is not None
        if error or done is None or cut or rounds.stopped or done.finish_reason != "stop":
            break
        calls = generation.reader.calls
        if not calls:
            break
        try:
            follow = await rounds.run_calls(
                calls,
                generation.reader.content,
                append,
                run.publish,
            )
            if follow is None:
                break
            try:
                generation.start(rounds.submit(follow))
            except TooLong:  # no room left for the tools' descriptions: answer now
                generation.start(rounds.submit(rounds.unoffered()))
        except asyncio.CancelledError:
            error = "the server stopped while this answer was being written"
            break
        except Exception as exc:  # a pass that cannot start ends the answer, stored
            error = f"the tools' results could not be answered: {exc}"
            break
    if done is not None:
        usage = Usage(total.prompt, total.completion, total.cached)
        if error is not None:
            done = replace(done, usage=usage, finish_reason="error", error=error)
        else:
            reason = "cancelled" if rounds.stopped else done.finish_reason
            done = replace(done, usage=usage, finish_reason=reason)
    return done, error
