"""Taking a turn: validate, assemble the prompt, submit to the engine, persist the answer once."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from chatbox.chat.admission import Ticket, announce_queue, route_out
from chatbox.chat.completions import submit
from chatbox.chat.context import ContextProvider, TurnContext, with_context
from chatbox.chat.conversations import Conversations
from chatbox.chat.errors import Busy, InvalidInput, NotFound, TooLong
from chatbox.chat.options import TurnOptions
from chatbox.chat.prompt import fit_history, turn_messages
from chatbox.chat.runs import TurnRun
from chatbox.engine.types import (
    ChatMessage,
    DoneEvent,
    Engine,
    Generation,
    GenerationRequest,
    TokenEvent,
)
from chatbox.store import Conversation, Routing, TurnStatus, TurnUsage, User

ACTIVE_BRANCH = "__active__"  # parent sentinel: continue the conversation's active branch
_STATUS: dict[str, TurnStatus] = {
    "stop": "complete",
    "length": "complete",
    "cancelled": "stopped",
    "error": "failed",
}
FINISHED_RUN_TTL_S = 120.0  # a reconnecting client can still replay a just-finished answer


@dataclass
class ChatService(Conversations):
    """Conversations and their turns for the web layer; owns the turn-taking state."""

    context: ContextProvider | None = None  # knowledge: memory facts, document passages
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _closing: bool = False
    _contexts: dict[str, tuple[str, TurnContext]] = field(default_factory=dict)

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
            raise TooLong(len(content), self.settings.max_message_chars)
        conv = await self.conversation(user, conv_id)
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
        conv = await self.conversation(user, conv_id)
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
        conv = await self.conversation(user, conv_id)
        target = turn_id or conv.active_leaf_id
        turn = await self.store.turns.get(conv.id, target) if target else None
        if turn is None:
            raise NotFound("turn not found")
        parent = turn.parent_id if turn.role == "assistant" else turn.id
        if parent is None:
            raise InvalidInput("nothing to regenerate")
        return await self._begin(user, conv, parent, None, options or TurnOptions())

    async def switch_branch(self, user: User, conv_id: str, turn_id: str) -> None:
        conv = await self.conversation(user, conv_id)
        if await self.store.turns.get(conv.id, turn_id) is None:
            raise NotFound("turn not found")
        if conv.id in self._runs or conv.id in self._reserved:
            raise Busy("this conversation is still generating an answer")
        leaf = await self.store.turns.deepest_leaf(conv.id, turn_id)
        await self.store.turns.set_active_leaf(conv.id, leaf)

    async def cancel(self, user: User, conv_id: str) -> bool:
        """Stop the running answer; False when nothing was running."""
        conv = await self.conversation(user, conv_id)
        run = self._runs.get(conv.id)
        if run is None:
            return False
        run.on_abandon()
        return True

    async def delete(self, user: User, conv_id: str) -> None:
        conv = await self.conversation(user, conv_id)
        run = self._runs.get(conv.id)
        if run is not None:
            run.on_abandon()
        await self.store.conversations.delete(user.id, conv.id)

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
        # Check-and-reserve happens before the first await: two sends can never both pass.
        if conv.id in self._runs or conv.id in self._reserved:
            raise Busy("this conversation is still generating an answer; stop it or wait")
        self._reserved.add(conv.id)
        try:
            ticket = await self.gate.admit(user, options.model or conv.model, content or "")
            try:
                return await self._start(conv, parent_id, content, options, ticket)
            except BaseException:
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
    ) -> TurnRun:
        model = ticket.model
        engine = await self.models.engine(model)
        history = turn_messages(await self.store.turns.path(conv.id, parent_id))
        if content is not None:
            history.append(ChatMessage("user", content))
        sampling = options.sampling(self.settings.max_tokens)
        limit = engine.info.n_ctx_per_seq
        # Leave room for an answer; the newest message itself must fit or nothing is stored.
        budget = max(limit // 2, limit - sampling.max_tokens)
        # Tokenizing runs in a thread: a huge message must not stall every other user's
        # request on the event loop before it is refused.
        newest = await asyncio.to_thread(engine.count_tokens, tuple(history[-1:]))
        if newest > budget:
            raise TooLong(newest, budget)
        knowledge = await self._knowledge(conv, history, budget - newest, engine)
        if knowledge.text:
            history[-1] = ChatMessage("user", with_context(history[-1].content, knowledge))
        messages, _ = await asyncio.to_thread(
            fit_history, conv.system_prompt, history, budget, engine.count_tokens
        )
        request = GenerationRequest(
            messages,
            sampling,
            cache_key=conv.id,
            cache_scope=conv.user_id,
            priority=ticket.priority,
        )
        generation = submit(engine, request, self.gate.policy.overload.retry_after_s)
        try:
            user_turn_id = None
            if content is not None:
                user_turn = await self.store.turns.append_user(conv.id, parent_id, content)
                parent_id = user_turn_id = user_turn.id
            assert parent_id is not None
            draft_id = await self.store.turns.start_draft(
                conv.id,
                parent_id,
                model,
                Routing(ticket.route.reason, ticket.route.arm, ticket.route.degraded_from),
            )
        except BaseException:
            generation.cancel()
            raise
        run = TurnRun(
            conv.id,
            draft_id,
            parent_id,
            model,
            user_turn_id,
            self.settings.disconnect_grace_s,
            on_abandon=generation.cancel,
        )
        self._runs[conv.id] = run
        self._contexts[draft_id] = (conv.user_id, knowledge)
        run.publish(
            "start",
            {
                "turn_id": draft_id,
                "user_turn_id": user_turn_id,
                "parent_id": parent_id,
                "model": model,
                **route_out(ticket),
            },
        )
        position = ticket.position()
        if position > 0:  # say so before the first token can race it; changes follow
            run.publish("queued", {"position": position})
        task = asyncio.create_task(self._drive(run, generation, ticket))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return run

    async def _drive(self, run: TurnRun, generation: Generation, ticket: Ticket) -> None:
        done: DoneEvent | None = None
        error: str | None = None
        last_flush = time.monotonic()
        announcer = asyncio.create_task(announce_queue(run, ticket))
        try:
            async for event in generation:
                if isinstance(event, TokenEvent):
                    if not ticket.started:
                        ticket.mark_started()
                        announcer.cancel()
                    run.publish("token", {"text": event.text})
                    if time.monotonic() - last_flush >= self.settings.draft_flush_s:
                        last_flush = time.monotonic()
                        await self.store.turns.update_draft(run.turn_id, run.text)
                elif isinstance(event, DoneEvent):
                    done = event
        except asyncio.CancelledError:
            generation.cancel()
            error = "the server stopped while this answer was being written"
        except Exception as exc:  # one failing request must not take the service down
            generation.cancel()
            error = f"generation failed: {exc}"
        announcer.cancel()
        if done is not None:
            status = _STATUS[done.finish_reason]
            error = done.error
            usage = TurnUsage(
                done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.cached_tokens
            )
        else:
            status, usage = ("interrupted" if self._closing else "failed"), TurnUsage()
        try:
            await ticket.finish(done.usage if done is not None else None)
            turn = await self.store.turns.finish_draft(run.turn_id, status, run.text, usage, error)
        finally:
            self._runs.pop(run.conversation_id, None)
            self._finished[run.turn_id] = run
            asyncio.get_running_loop().call_later(
                FINISHED_RUN_TTL_S, self._finished.pop, run.turn_id, None
            )
        await self._after_turn(run, turn.id)
        payload = {
            "turn_id": turn.id,
            "status": status,
            "model": run.model,
            **route_out(ticket),
            "finish_reason": done.finish_reason if done else "error",
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

    async def _knowledge(
        self, conv: Conversation, history: list[ChatMessage], room: int, engine: Engine
    ) -> TurnContext:
        """Memory facts and document passages for the newest user message, within room."""
        budget = min(self.settings.knowledge_tokens, room)
        if self.context is None or not history or history[-1].role != "user" or budget < 32:
            return TurnContext()

        def count(text: str) -> int:
            return engine.count_tokens((ChatMessage("user", text),))

        return await self.context.for_turn(
            conv.user_id, conv.id, history[-1].content, budget, count
        )

    async def _after_turn(self, run: TurnRun, turn_id: str) -> None:
        """Publish the passages the answer drew on (before `done`); let knowledge follow up."""
        user_id, knowledge = self._contexts.pop(run.turn_id, ("", TurnContext()))
        if self.context is None or not user_id:
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
        await self.context.turn_finished(user_id, run.conversation_id, turn_id, knowledge)

    async def shutdown(self) -> None:
        """Stop every running answer; each is saved as interrupted."""
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
