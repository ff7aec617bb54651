"""Taking a turn: validate, assemble the prompt, submit to the engine, persist the answer once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from chatbox.chat.admission import Ticket, announce_queue, route_out
from chatbox.chat.caches.semantic_cache import CACHED_ROUTE, Replay, SemanticHit, partition_key
from chatbox.chat.context import ContextProvider, TurnContext, with_context
from chatbox.chat.conversations import Conversations
from chatbox.chat.errors import Busy, InvalidInput, NotFound, Refused, TooLong
from chatbox.chat.moderated import (
    moderation_event,
    note_input,
    note_output,
    screen_input,
    watch_answer,
)
from chatbox.chat.options import TurnOptions
from chatbox.chat.privacy.temporary import keeps_nothing, refuse_storing
from chatbox.chat.prompt import fit_history, turn_messages
from chatbox.chat.rollout.feedback import my_rating, rate
from chatbox.chat.rollout.live_grading import SAMPLED_ROUTES
from chatbox.chat.rollout.shadow import Served
from chatbox.chat.running.drafts import DraftSaver, until_stored
from chatbox.chat.running.fronts import Fronts
from chatbox.chat.running.runs import TurnRun, drive
from chatbox.chat.stateless.completions import submit
from chatbox.chat.summaries import history_budget, unsummarised, with_summary
from chatbox.chat.teams.workspaces import prompt_scope
from chatbox.chat.tools.approval import ToolApprovals
from chatbox.chat.tools.base import Toolbox
from chatbox.chat.tools.turns import (
    CallFilter,
    ToolLoop,
    ToolOffer,
    relay_with_tools,
    tool_loop,
    tool_offer,
)
from chatbox.engine.types import (
    ChatMessage,
    DoneEvent,
    Engine,
    Generation,
    GenerationRequest,
)
from chatbox.moderation import Verdict
from chatbox.observability import Telemetry
from chatbox.store import (
    Conversation,
    Feedback,
    FeedbackTally,
    Routing,
    Turn,
    TurnStatus,
    TurnUsage,
    User,
)
from chatbox.store.run_channel import RunChannel

ACTIVE_BRANCH = "__active__"  # parent sentinel: continue the conversation's active branch
_STATUS: dict[str, TurnStatus] = {
    "stop": "complete",
    "length": "complete",
    "cancelled": "stopped",
    "error": "failed",
}
FINISHED_RUN_TTL_S = 120.0  # a reconnecting client can still replay a just-finished answer


@dataclass(frozen=True)
class FirstQuestion:
    """A first question through the semantic cache: where its answer is kept, or the hit
    that answered it."""

    partition: str
    vector: np.ndarray
    text: str
    hit: SemanticHit | None = None


@dataclass
class ChatService(Conversations):
    """Conversations and their turns for the web layer; owns the turn-taking state."""

    context: ContextProvider | None = None  # knowledge: memory facts, document passages
    telemetry: Telemetry = field(default_factory=Telemetry.off)  # the turn's trace
    toolboxes: Sequence[Toolbox] = ()  # the tools the assistant may call (services wires them)
    approvals: ToolApprovals = field(default_factory=ToolApprovals)  # calls awaiting the user
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _closing: bool = False
    _contexts: dict[str, tuple[str, TurnContext]] = field(default_factory=dict)
    _questions: dict[str, FirstQuestion] = field(default_factory=dict)  # by answer turn id

    # -- writing -------------------------------------------------------------------------

    async def send(
        self,
        user: User,
        conv_id: str,
        content: str,
        parent_id: str | None = ACTIVE_BRANCH,
        options: TurnOptions | None = None,
    ) -> TurnRun:
        """Append a user turn (under parent_id, default the active leaf) and start the answer."""
        if not content.strip():
            raise InvalidInput("the message is empty")
        if len(content) > self.settings.max_message_chars:
            raise TooLong.characters(len(content), self.settings.max_message_chars)
        conv = await self.conversation(user, conv_id, "continue")
        if parent_id == ACTIVE_BRANCH:
            parent_id = conv.active_leaf_id
        elif parent_id is not None and await self.store.turns.get(conv.id, parent_id) is None:
            raise NotFound("parent turn not found")
        return await self._begin(user, conv, parent_id, content, options or TurnOptions())

    async def edit(
        self,
        user: User,
        conv_id: str,
        turn_id: str,
        content: str,
        options: TurnOptions | None = None,
    ) -> TurnRun:
        """A new version of an earlier user message: a sibling branch of it."""
        conv = await self.conversation(user, conv_id, "continue")
        turn = await self.store.turns.get(conv.id, turn_id)
        if turn is None or turn.role != "user":
            raise NotFound("user turn not found")
        return await self.send(user, conv_id, content, turn.parent_id, options)

    async def regenerate(
        self,
        user: User,
        conv_id: str,
        turn_id: str | None = None,
        options: TurnOptions | None = None,
    ) -> TurnRun:
        """A new answer beside an earlier one (default: the active branch's last answer)."""
        conv = await self.conversation(user, conv_id, "continue")
        target = turn_id or conv.active_leaf_id
        turn = await self.store.turns.get(conv.id, target) if target else None
        if turn is None:
            raise NotFound("turn not found")
        parent = turn.parent_id if turn.role != "user" else turn.id
        while parent is not None:  # a new answer calls its tools afresh: above the old ones
            above = await self.store.turns.get(conv.id, parent)
            if above is None or above.role not in ("tool_call", "tool_result"):
                break
            parent = above.parent_id
        if parent is None:
            raise InvalidInput("nothing to regenerate")
        return await self._begin(user, conv, parent, None, options or TurnOptions())

    async def switch_branch(self, user: User, conv_id: str, turn_id: str) -> None:
        conv = await self.conversation(user, conv_id, "continue")
        if await self.store.turns.get(conv.id, turn_id) is None:
            raise NotFound("turn not found")
        if conv.id in self._runs or conv.id in self._reserved or await self._elsewhere(conv.id):
            raise Busy("this conversation is still generating an answer")
        leaf = await self.store.turns.deepest_leaf(conv.id, turn_id)
        await self.store.turns.set_active_leaf(conv.id, leaf)

    async def cancel(self, user: User, conv_id: str) -> bool:
        """Stop the running answer; False when nothing was running."""
        conv = await self.conversation(user, conv_id, "continue")
        run = self._runs.get(conv.id)
        if run is None:
            return self.fronts is not None and await self.fronts.cancel(conv.id)
        run.on_abandon()
        return True

    async def decide_tool_call(self, user: User, conv_id: str, call_id: str, allow: bool) -> None:
        """Allow or deny a tool call waiting in the conversation's running answer; NotFound
        unless the answer is for `user`. Audited."""
        conv = await self.conversation(user, conv_id)
        await self.approvals.decide(user, conv.id, call_id, allow)

    def join_fronts(self, channel: RunChannel) -> None:
        """Relay and mirror running answers with the other fronts on the shared database."""
        self.fronts = Fronts(
            self.store,
            channel,
            self._runs,
            self._finished,
            self.settings.disconnect_grace_s,
            FINISHED_RUN_TTL_S,
            self.settings.front_grace_s,
        )
        self.fronts.start()

    async def stored_end(self, conv_id: str, turn_id: str, after: int) -> TurnRun | None:
        """The end of an answer another front wrote and cannot relay (it died, or it is
        stored), read from the shared database; None elsewhere."""
        if self.fronts is None:
            return None
        return await self.fronts.stored_end(conv_id, turn_id, after)

    async def _elsewhere(self, conv_id: str) -> bool:
        """True while another front on the shared database writes this conversation's answer."""
        return self.fronts is not None and await self.fronts.writing_elsewhere(conv_id)

    async def rate(
        self, user: User, conv_id: str, turn_id: str, rating: str, comment: str | None = None
    ) -> Feedback:
        """The user's rating of an answer (and why), counted per model and arm."""
        given = await rate(self.store, self.gate.policy, user, conv_id, turn_id, rating, comment)
        self.telemetry.feedback_given(given.model or "", given.arm or "", given.rating)
        return given

    async def rating(self, user: User, conv_id: str, turn_id: str) -> Feedback | None:
        """The user's rating of an answer that counts now (None when not rated)."""
        return await my_rating(self.store, user, conv_id, turn_id)

    async def feedback_tallies(self) -> list[FeedbackTally]:
        """Ratings that count, per model and arm (the console's table)."""
        return await self.store.feedback.tallies()

    async def delete(self, user: User, conv_id: str) -> None:
        """Erase the conversation: its answer stops, its content and all made from it go."""
        conv = await self.conversation(user, conv_id, "own")
        await self.erase(user.id, [conv.id])

    # -- the turn itself -----------------------------------------------------------------

    async def _begin(
        self,
        user: User,
        conv: Conversation,
        parent_id: str | None,
        content: str | None,
        options: TurnOptions,
    ) -> TurnRun:
        self.check_options(options)
        if await keeps_nothing(self.store, self.gate.policy, user):
            raise refuse_storing()
        # Check-and-reserve happens before the first await: two sends can never both pass.
        if conv.id in self._runs or conv.id in self._reserved:
            raise Busy("this conversation is still generating an answer; stop it or wait")
        self._reserved.add(conv.id)
        try:
            if await self._elsewhere(conv.id):
                raise Busy("this conversation is still generating an answer; stop it or wait")
            with self.telemetry.turn(**{"chatbox.regenerate": content is None}):
                ticket = await self.gate.admit(
                    user,
                    options.model or self.conversation_model(user, conv),
                    content or "",
                    options.n,
                )
                self.telemetry.annotate(**{"chatbox.model": ticket.model})
                try:
                    if content:  # a message too long is refused before it costs moderation
                        engine = await self.models.engine(ticket.model)
                        await self._fits(engine, content, options)
                    # Moderation after the rate limits and before any model work; a refused
                    # message raises here, with nothing stored.
                    screened = await screen_input(self.moderation, user, content or "")
                    return await self._start(conv, parent_id, content, options, ticket, screened)
                except BaseException as exc:
                    if isinstance(exc, Refused):
                        ticket.outcome = "refused"
                    await ticket.finish(None)
                    raise
        finally:
            self._reserved.discard(conv.id)

    async def _start(
        self,
        conv: Conversation,
        parent_id: str | None,
        content: str | None,
        options: TurnOptions,
        ticket: Ticket,
        screened: Verdict | None = None,
    ) -> TurnRun:
        model = ticket.model
        engine = await self.models.engine(model)
        path = await self.store.turns.path(conv.id, parent_id)
        # The newest summary on this branch stands in for the turns it covers.
        summary = await self.store.summaries.on_path(conv.id, [t.id for t in path])
        history = turn_messages(unsummarised(path, summary))
        if content is not None:
            history.append(ChatMessage("user", content))
        sampling = options.sampling(self.settings.max_tokens)
        newest, budget = await self._fits(engine, history[-1].content, options)
        with self.telemetry.span("retrieval"):
            t0 = time.perf_counter()
            knowledge = await self._knowledge(conv, history, budget - newest, engine)
            self.telemetry.retrieved(time.perf_counter() - t0)
        if knowledge.text:
            history[-1] = ChatMessage("user", with_context(history[-1].content, knowledge))
        system, shared, scope = await prompt_scope(self.store, conv)
        if summary is not None:  # one system message, no longer all configured
            system, shared = with_summary(system, summary), 0
        messages, prompt_tokens = await asyncio.to_thread(
            fit_history, system, history, budget, engine.count_tokens
        )
        question = None
        if content is not None and not path and summary is None and not knowledge.text:
            question = await self._first_question(conv, content, options, ticket, system, screened)
        routing = Routing(ticket.route.reason, ticket.route.arm, ticket.route.degraded_from)
        generation: Generation
        request: GenerationRequest | None = None
        rounds: ToolLoop | None = None
        source: Generation | None = None
        if question is not None and question.hit is not None:
            generation = Replay(question.hit.entry.answer, question.hit.entry.usage)
            routing = Routing(CACHED_ROUTE, ticket.route.arm)
        else:
            request = GenerationRequest(
                messages,
                sampling,
                cache_key=conv.id,
                cache_scope=scope,
                shared_messages=shared,
                priority=ticket.priority,
            )
            retry = self.gate.policy.overload.retry_after_s
            rounds = await self._tool_loop(ticket, conv, options, request, engine, retry)
            if rounds is not None:
                request = await rounds.first()
                if not request.tools:  # no room for their descriptions: answer without
                    rounds = None
            try:
                generation = submit(engine, request, retry)
            except TooLong:
                if rounds is None or options.force_tools:
                    raise
                # No room for the tools' descriptions in this model's context: answer without.
                request, rounds = rounds.unoffered(), None
                generation = submit(engine, request, retry)
            source = CallFilter(generation) if rounds is not None else None
        try:
            with self.telemetry.span("store.save_prompt"):
                user_turn_id = None
                if content is not None:
                    user_turn = await self.store.turns.append_user(
                        conv.id, parent_id, content, ticket.user.id
                    )
                    parent_id = user_turn_id = user_turn.id
                    await note_input(self.moderation, ticket.user, screened, content, user_turn)
                assert parent_id is not None
                draft_id = await self.store.turns.start_draft(
                    conv.id, parent_id, model, routing, ticket.user.id
                )
        except BaseException:
            generation.cancel()
            raise

        def stop() -> None:
            if rounds is not None:
                rounds.stop()
            (source or generation).cancel()

        run = TurnRun(
            conv.id,
            draft_id,
            parent_id,
            model,
            user_turn_id,
            self.settings.disconnect_grace_s,
            on_abandon=stop,
        )
        run.prompt_tokens = prompt_tokens if request is not None else 0
        self._runs[conv.id] = run
        # A workspace conversation feeds no one's memory (its turns have several writers).
        self._contexts[draft_id] = (conv.user_id if conv.workspace_id is None else "", knowledge)
        if question is not None:
            self._questions[draft_id] = question
        run.publish(
            "start",
            {
                "turn_id": draft_id,
                "user_turn_id": user_turn_id,
                "parent_id": parent_id,
                "model": model,
                **self._route_out(ticket, question),
            },
        )
        position = ticket.position()
        if position > 0:  # say so before the first token can race it; changes follow
            run.publish("queued", {"position": position})
        if screened is not None and screened.flagged:
            run.publish(
                "moderation", {**moderation_event(screened, user_turn_id), "direction": "input"}
            )
        task = drive(
            run, self._drive(run, source or generation, ticket, request, content or "", rounds)
        )
        task.add_done_callback(self.telemetry.hand_off_turn())  # the turn ends with its answer
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return run

    def tool_offer(self, user: User) -> ToolOffer | None:
        """The tools the user's tier allows (None: none), for the composer's switch."""
        return tool_offer(self.toolboxes, self.gate.policy.tier(user.tier))

    async def _tool_loop(
        self,
        ticket: Ticket,
        conv: Conversation,
        options: TurnOptions,
        request: GenerationRequest,
        engine: Engine,
        retry: int,
    ) -> ToolLoop | None:
        """The answer's tools (None: none offered), within the tier's budget."""
        user = ticket.user

        async def keeps() -> bool:
            return not await keeps_nothing(self.store, self.gate.policy, user)

        return await tool_loop(
            self.toolboxes,
            self.gate.policy.tier(user.tier),
            user,
            conv,
            options,
            request,
            engine,
            retry,
            self.store.tool_results,
            keeps,
            self.approvals,
        )

    async def _drive(
        self,
        run: TurnRun,
        generation: Generation,
        ticket: Ticket,
        request: GenerationRequest | None,
        asked: str = "",
        rounds: ToolLoop | None = None,
    ) -> None:
        """Relay the answer to its run and store it; `request` is None for a cached answer."""
        announcer = asyncio.create_task(announce_queue(run, ticket))
        watch = watch_answer(self.moderation, ticket.user, run, generation)
        saver = DraftSaver(
            run,
            lambda text: self.store.turns.update_draft(
                run.turn_id, text, TurnUsage(run.prompt_tokens, run.tokens)
            ),
            self.settings.draft_flush_s,
        ).start()

        async def on_token() -> None:
            if not announcer.done():
                announcer.cancel()  # it is answering: no more queue positions

        try:
            done, error = await relay_with_tools(
                run,
                generation,
                ticket,
                watch,
                on_token,
                rounds,
                lambda role, text: self.store.turns.append_tool(run.turn_id, role, text),
            )
        finally:
            await saver.stop()
        if done is not None and done.timings is not None:
            t = done.timings
            self.telemetry.engine_phases(run.model, t.queued_s, t.prefill_s, t.decode_s)
        announcer.cancel()
        if done is not None:
            status = _STATUS[done.finish_reason]
            error = done.error
            usage = TurnUsage(
                done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.cached_tokens
            )
        else:
            status, usage = ("interrupted" if self._closing else "failed"), TurnUsage()
        content = run.text
        if watch is not None and watch.verdict is not None:
            status, content = "filtered", watch.verdict.notice()  # the text goes to review only
        if status in ("failed", "filtered"):
            ticket.outcome = "error" if status == "failed" else "filtered"
        self.telemetry.annotate(**{"chatbox.turn_status": status})
        self.telemetry.turn_finished(run.model, status)
        try:
            with self.telemetry.span("store.save_answer"):
                # Through an outage: the whole answer, once the database is back.
                turn = await until_stored(
                    lambda: self._save_answer(run, status, content, usage, error),
                    self.settings.answer_store_wait_s,
                    f"answer {run.turn_id}",
                )
                status = turn.status
            await until_stored(
                lambda: ticket.finish(done.usage if done is not None else None),
                self.settings.answer_store_wait_s,
                f"the usage of answer {run.turn_id}",
            )
        finally:
            self._runs.pop(run.conversation_id, None)
            self._finished[run.turn_id] = run
            asyncio.get_running_loop().call_later(
                FINISHED_RUN_TTL_S, self._finished.pop, run.turn_id, None
            )
        await note_output(self.moderation, ticket.user, watch, run, turn.id)
        question = self._questions.pop(run.turn_id, None)
        clean = watch is None or (watch.verdict is None and watch.mark is None)
        if question is not None and question.hit is None and status == "complete" and clean:
            assert done is not None
            self.semantic.put(
                question.partition,
                ticket.user.id,
                run.conversation_id,
                question.text,
                question.vector,
                content,
                done.usage,
            )
        sampled = ticket.route.reason in SAMPLED_ROUTES  # a model the user picked is no arm
        if self.canaries is not None and status == "complete" and sampled:
            self.canaries.sample_live(ticket.user, ticket.route.arm, asked, content)
        await self._after_turn(run, turn.id)
        self.summariser.after_turn(ticket.user.id, run.conversation_id, turn.id, run.model)
        payload = {
            "turn_id": turn.id,
            "status": status,
            "model": run.model,
            **self._route_out(ticket, question),
            "finish_reason": (
                "content_filter"
                if status == "filtered"
                else done.finish_reason
                if done
                else "error"
            ),
            "usage": {
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "cached_tokens": usage.cached_tokens,
            },
        }
        if status == "failed":
            run.publish("error", {**payload, "message": error or "generation failed"})
        else:
            run.publish("done", payload)
        finished = done is not None and status in ("complete", "filtered")
        if finished and request is not None and self.shadow is not None:  # not a cached answer
            assert done is not None
            await self.shadow.offer(served(ticket.user, run, request, done, status))

    async def _save_answer(
        self, run: TurnRun, status: TurnStatus, content: str, usage: TurnUsage, error: str | None
    ) -> Turn:
        """The answer written once; where another front on the shared database took this
        one for dead and stored it as interrupted already, that turn."""
        try:
            return await self.store.turns.finish_draft(run.turn_id, status, content, usage, error)
        except KeyError:
            stored = await self.store.turns.written(run.conversation_id, run.turn_id)
            if stored is None or self.fronts is None:
                raise
            return stored

    async def _first_question(
        self,
        conv: Conversation,
        content: str,
        options: TurnOptions,
        ticket: Ticket,
        system: str | None,
        screened: Verdict | None,
    ) -> FirstQuestion | None:
        """A conversation's first question (no history, passages or memory in its prompt)
        through the semantic cache, where the user's tier uses it: its partition and vector,
        and the kept answer that means the same, unless `options.fresh`. None where the cache
        is not for this question: off for the tier, a message moderation marked, or zero
        retention (`keeps_nothing`, the one check: nothing is read or kept then)."""
        policy = self.gate.policy.semantic_cache
        tier = self.gate.policy.tier(ticket.user.tier).name
        if self.embed is None or not self.semantic.enabled_for(tier) or options.tools:
            return None
        if screened is not None and screened.flagged:
            return None
        if await keeps_nothing(self.store, self.gate.policy, ticket.user):
            return None
        engine = await self.models.engine(ticket.model)
        identity = await self.answers.identities.of(engine.info)
        if tier in policy.public_tiers:
            scope = f"tier:{tier}"
        elif conv.workspace_id is not None:
            scope = f"workspace:{conv.workspace_id}"
        else:
            scope = ticket.user.id
        partition = partition_key(
            scope,
            ticket.model,
            identity,
            self._moderation_rules(tier),
            system or "",
            repr(options.sampling(self.settings.max_tokens)),
        )
        vector = await self.embed(content)
        if self.erasures is not None and not options.fresh:  # erased elsewhere: never served
            await self.erasures.catch_up()
        hit = None if options.fresh else self.semantic.get(partition, content, vector)
        return FirstQuestion(partition, vector, content, hit)

    @staticmethod
    def _route_out(ticket: Ticket, question: FirstQuestion | None) -> dict[str, object]:
        """How the answer was chosen, for its events: a semantic cache hit says so."""
        if question is None or question.hit is None:
            return route_out(ticket)
        return {
            "route": CACHED_ROUTE,
            "cached": True,
            "similarity": round(question.hit.similarity, 4),
        }

    async def _fits(self, engine: Engine, text: str, options: TurnOptions) -> tuple[int, int]:
        """The newest message's tokens and the history's budget; TooLong if it cannot fit.

        Tokenizing runs in a thread: a huge message must not stall every other user's
        request on the event loop before it is refused."""
        # Leave room for an answer; the newest message itself must fit or nothing is stored.
        budget = history_budget(
            engine.info.n_ctx_per_seq, options.sampling(self.settings.max_tokens).max_tokens
        )
        newest = await asyncio.to_thread(engine.count_tokens, (ChatMessage("user", text),))
        if newest > budget:
            raise TooLong(newest, budget)
        return newest, budget

    async def _knowledge(
        self, conv: Conversation, history: list[ChatMessage], room: int, engine: Engine
    ) -> TurnContext:
        """Memory facts and document passages for the newest user message, within room."""
        budget = min(self.settings.knowledge_tokens, room)
        if self.context is None or not history or history[-1].role != "user" or budget < 32:
            return TurnContext()

        def count(text: str) -> int:
            return engine.count_tokens((ChatMessage("user", text),))

        # A workspace conversation: its library only, never one member's memory or documents.
        return await self.context.for_turn(
            conv.user_id, conv.id, history[-1].content, budget, count, conv.workspace_id
        )

    async def _after_turn(self, run: TurnRun, turn_id: str) -> None:
        """Publish the passages the answer drew on (before `done`); let knowledge follow up."""
        user_id, knowledge = self._contexts.pop(run.turn_id, ("", TurnContext()))
        if self.context is None:  # user_id "": a workspace's turn (cited, feeds no memory)
            return
        if knowledge.citations or knowledge.memory_ids:
            run.publish(
                "citations",
                {
                    "turn_id": turn_id,
                    "citations": [c.as_dict() for c in knowledge.citations],
                    "memories": list(knowledge.memory_ids),
                },
            )
        if knowledge.remembered:
            run.publish("memory", {"turn_id": turn_id, "facts": list(knowledge.remembered)})
        await self.context.turn_finished(user_id, run.conversation_id, turn_id, knowledge)

    async def shutdown(self) -> None:
        """Stop every running answer; each is saved as interrupted."""
        self._closing = True
        self.answers.clear()
        await self.summariser.shutdown()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.fronts is not None:
            await self.fronts.stop()


def served(
    user: User, run: TurnRun, request: GenerationRequest, done: DoneEvent, status: str
) -> Served:
    """A finished turn's answer as its shadow sees it: the prompt, the text and its numbers."""
    ttft = speed = None
    tokens = done.usage.completion_tokens
    if done.timings is not None:
        ttft = done.timings.queued_s + done.timings.prefill_s
        if done.timings.decode_s > 0 and tokens > 1:
            speed = (tokens - 1) / done.timings.decode_s
    return Served(
        user,
        run.model,
        request.messages,
        run.text,
        status == "filtered",
        tokens,
        ttft,
        speed,
        request.cache_scope,
    )
