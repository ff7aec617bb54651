"""Conversations as the web layer reads and edits them: list, create, rename, view a branch.

`ChatService` (chatbox/chat/service.py) adds taking turns on top of this; the run state both
need (which conversations are answering now) lives here.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chatbox.catalog.manifest import ManifestModel
from chatbox.catalog.starters import Starter, starters_for
from chatbox.chat.admission import Gatekeeper, Ticket
from chatbox.chat.caches.answer_cache import AnswerCache, deterministic, request_key
from chatbox.chat.caches.semantic_cache import SemanticCache
from chatbox.chat.errors import InvalidInput, NotFound
from chatbox.chat.models import ModelProvider, resolve_model
from chatbox.chat.moderated import ModeratedGeneration
from chatbox.chat.options import TurnOptions, check_stops
from chatbox.chat.privacy.erasure import (
    ErasureWatch,
    erase_conversations,
    forget_kv,
    forget_scope_kv,
)
from chatbox.chat.privacy.temporary import keeps_nothing, refuse_storing
from chatbox.chat.rollout.live_grading import GradedGeneration, Sampler, graded
from chatbox.chat.rollout.shadow import MirroredGeneration, ShadowTraffic, mirrored
from chatbox.chat.running.fronts import Fronts
from chatbox.chat.running.runs import TurnRun
from chatbox.chat.stateless.completions import complete
from chatbox.chat.summaries import Summariser, history_budget, sent_window
from chatbox.chat.teams.access import Act, conversation_for, may
from chatbox.chat.teams.workspaces import prompt_scope
from chatbox.chat.views import ConversationView, ModerationMark, TurnView, strongest
from chatbox.engine.types import ChatMessage, Generation, Usage
from chatbox.moderation import ModerationService
from chatbox.settings import Settings
from chatbox.store import Conversation, Store, Turn, User
from chatbox.store.erasure import Erased


@dataclass(frozen=True)
class Exact:
    """A request through the answer cache: a hit's `body`, or the running `generation` (and
    the `key` its answer may be kept under)."""

    model: str
    ticket: Ticket | None
    generation: Generation | None
    key: str | None
    body: bytes | None = None


@dataclass
class Conversations:
    """The user's conversations: reading and editing them, never taking a turn."""

    store: Store
    models: ModelProvider
    settings: Settings
    gate: Gatekeeper  # quotas, routing, overload
    moderation: ModerationService | None = None  # input and output checks
    shadow: ShadowTraffic | None = None  # answers mirrored to a candidate model once done
    canaries: Sampler | None = None  # grades sampled live answers of canary tiers
    _runs: dict[str, TurnRun] = field(default_factory=dict)  # answering now, by conversation
    _reserved: set[str] = field(default_factory=set)  # about to answer
    _finished: dict[str, TurnRun] = field(default_factory=dict)  # by turn id, kept briefly
    fronts: Fronts | None = None  # other fronts on a shared database: their answers here
    summariser: Summariser = field(init=False)  # long conversations' oldest parts
    answers: AnswerCache = field(init=False)  # deterministic API answers (answer_cache.py)
    semantic: SemanticCache = field(init=False)  # first questions' answers (semantic_cache.py)
    # A question's vector (the knowledge embedder's); None: no semantic cache.
    embed: Callable[[str], Awaitable[np.ndarray]] | None = None
    erasures: ErasureWatch | None = None  # erasures by other processes (the journal)
    # A model's built-in catalogue entry (None: one an admin added, or a replica's).
    catalogue: Callable[[str], ManifestModel | None] | None = None

    def __post_init__(self) -> None:
        self.answers = AnswerCache(self.gate.policy.answer_cache)
        self.semantic = SemanticCache(self.gate.policy.semantic_cache)
        # Engines are looked up per call, through whatever provides them now.
        self.summariser = Summariser(self.store, lambda m: self.models.engine(m), self.settings)

    # -- conversations -------------------------------------------------------------------

    async def conversations(self, user: User) -> list[Conversation]:
        """The user's conversations, most recently active first."""
        return await self.store.conversations.list(user.id)

    async def workspace_names(self, user: User) -> dict[str, str]:
        """The workspaces the user belongs to, id to name (the sidebar lists them and marks
        the conversations that live in one)."""
        return {ws.id: ws.name for ws in await self.store.workspaces.list(user.id)}

    async def author_names(self, user: User, view: ConversationView) -> dict[str, str]:
        """Who wrote the user turns shown of a workspace conversation, author id to name
        ("You" for the reader); empty for a personal one, which has one writer."""
        if view.conversation.workspace_id is None:
            return {}
        names: dict[str, str] = {}
        for tv in view.turns:
            author = tv.turn.author_id or view.conversation.user_id  # written before authors
            if tv.turn.role != "user" or author in names:
                continue
            person = None if author == user.id else await self.store.users.get(author)
            name = person.name if person else "A former member"
            names[author] = "You" if author == user.id else name
        return names

    async def create_conversation(
        self,
        user: User,
        title: str | None = None,
        system_prompt: str | None = None,
        model: str | None = None,
    ) -> Conversation:
        self._check_fields(title=title, system_prompt=system_prompt)
        if model is not None:
            self.resolve_model(model)
        if await keeps_nothing(self.store, self.gate.policy, user):
            raise refuse_storing()
        return await self.store.conversations.create(user.id, title, system_prompt, model)

    def check_temporary(self, system_prompt: str | None, model: str | None) -> None:
        """The fields of a temporary chat, checked as a stored conversation's would be."""
        self._check_fields(system_prompt=system_prompt)
        if model is not None:
            self.resolve_model(model)

    def _check_fields(self, **fields: str | None) -> None:
        """A title or system prompt longer than the settings allow is refused (422)."""
        limits = {
            "title": self.settings.max_title_chars,
            "system_prompt": self.settings.max_system_prompt_chars,
        }
        for name, value in fields.items():
            limit = limits.get(name)
            if limit is not None and value is not None and len(value) > limit:
                raise InvalidInput(
                    f"{name} is {len(value):,} characters; the limit is {limit:,}", name
                )

    def check_options(self, options: TurnOptions) -> None:
        """Per-request generation options within the settings' limits (stop sequences)."""
        check_stops(options.stop, self.settings.max_stop_strings, self.settings.max_stop_chars)

    async def start_conversation(
        self,
        user: User,
        first: Callable[[Conversation], Awaitable[object]],
        system_prompt: str | None = None,
        model: str | None = None,
    ) -> Conversation:
        """A new conversation whose first step (a message, an attachment) must succeed:
        when `first` raises, the conversation is deleted again (no empty chats left)."""
        conv = await self.create_conversation(user, None, system_prompt, model)
        try:
            await first(conv)
        except BaseException:
            await self.erase(user.id, [conv.id])
            raise
        return conv

    async def update_conversation(
        self, user: User, conv_id: str, **changes: str | None
    ) -> Conversation:
        """Rename, or change the system prompt or model (a None value clears it): the
        starter's or a workspace owner's to change (`chatbox.chat.teams.access`). Under
        zero-data-retention a new title or system prompt is refused (it would be stored)."""
        self._check_fields(**{k: v for k, v in changes.items() if k != "model"})
        if changes.get("model") is not None:
            changes["model"] = self.resolve_model(changes["model"])
        await self.conversation(user, conv_id, "configure")
        texts = (changes.get("title"), changes.get("system_prompt"))
        if any(texts) and await keeps_nothing(self.store, self.gate.policy, user):
            raise refuse_storing()
        conv = await self.store.conversations.update(user.id, conv_id, **changes)
        if conv is None:
            raise NotFound("conversation not found")
        return conv

    def limit_headers(self, user: User) -> dict[str, str]:
        """The user's rate limits now, as x-ratelimit-* headers."""
        return self.gate.headers(user)

    async def complete(
        self,
        messages: tuple[ChatMessage, ...],
        options: TurnOptions,
        user: User | None = None,
        zero_retention: bool = False,
        prompt: str | None = None,
        prompts: int = 1,
    ) -> tuple[str, Generation, int]:
        """A stateless completion (the OpenAI-compatible API): model, stream, prompt size.
        `zero_retention`: its KV is never kept or parked, its review items keep no text.
        `prompt`: a raw prompt instead of `messages`, without the chat template; `prompts`:
        how many the request sends, whose n answers each count toward `max_streams`."""
        self.check_options(options)
        if user is not None and prompts > 1:
            asked = f"{prompts} prompts × n={options.n}"
            self.gate.check_streams(user, prompts * options.n, asked)
        model, generation, tokens = await complete(
            self.models,
            self.gate,
            self.settings.max_tokens,
            messages,
            options,
            user,
            self.moderation,
            zero_retention,
            prompt=prompt,
        )
        plain = prompt is None and options.n <= 1 and not options.tools
        generation = graded(generation, self.canaries, user, messages, plain, zero_retention)
        generation = mirrored(generation, self.shadow, user, model, messages, plain)
        return model, generation, tokens

    async def complete_exact(
        self,
        messages: tuple[ChatMessage, ...],
        options: TurnOptions,
        user: User,
        request: Mapping[str, Any],
    ) -> Exact:
        """A whole (not streamed) stateless completion through the answer cache: a hit
        carries the body first sent for this request; otherwise the generation runs, and
        `keep_answer` may keep its body. Admitted once either way (rate limits, budgets);
        a hit is charged as the policy's `answer_cache.charge` says. The cache is neither
        read nor written under zero retention (`keeps_nothing`, the one check) or for a
        request that is not deterministic."""
        self.check_options(options)
        zero_retention = await keeps_nothing(self.store, self.gate.policy, user)
        policy = self.gate.policy.answer_cache
        usable = policy.enabled and policy.max_bytes > 0 and deterministic(options)
        if zero_retention or not usable or not messages:
            model, generation, _ = await self.complete(messages, options, user, zero_retention)
            return Exact(model, None, generation, None)
        text = "\n".join(m.content for m in messages)
        ticket = await self.gate.admit(user, options.model, text, options.n)
        try:
            engine = await self.models.engine(ticket.model)
            identity = await self.answers.identities.of(engine.info)
            tier = self.gate.policy.tier(user.tier).name
            scope = f"tier:{tier}" if tier in policy.public_tiers else user.id
            key = request_key(
                scope,
                ticket.model,
                identity,
                self._moderation_rules(tier),
                request,
                options,
                self.settings.max_tokens,
            )
            hit = self.answers.get(key)
        except BaseException:
            await ticket.finish(None)
            raise
        if hit is not None:
            full = policy.charge == "full"
            charged = (hit.prompt_tokens, hit.completion_tokens) if full else (0, 0)
            # The usage write is not waited for: a hit's reply needs nothing from it.
            await ticket.finish(Usage(*charged, cached_tokens=hit.cached_tokens), later=True)
            return Exact(ticket.model, ticket, None, None, hit.body)
        model, generation, _ = await complete(
            self.models,
            self.gate,
            self.settings.max_tokens,
            messages,
            options,
            user,
            self.moderation,
            False,
            ticket,
        )
        plain = options.n <= 1 and not options.tools
        generation = graded(generation, self.canaries, user, messages, plain, False)
        generation = mirrored(generation, self.shadow, user, model, messages, plain)
        return Exact(model, ticket, generation, key)

    def keep_answer(self, exact: Exact, user: User, body: bytes, usage: Usage) -> bool:
        """Keep a missed request's whole answer for the next identical one: only one every
        moderation check passed without a mark (a hit is served without checks)."""
        if exact.key is None or exact.generation is None:
            return False
        generation = exact.generation
        while isinstance(generation, (MirroredGeneration, GradedGeneration)):
            generation = generation.inner
        if isinstance(generation, ModeratedGeneration):
            if not generation.clean():
                return False
        elif self.moderation is not None and self.moderation.enabled:
            return False  # moderation is on, yet this answer went unchecked
        counts = (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
        return self.answers.put(exact.key, user.id, body, counts)

    def forget_answers_of(self, user_id: str) -> int:
        """Drop the cached answers of an erased account (both answer caches)."""
        return self.answers.forget_owner(user_id) + self.semantic.forget(owner=user_id)

    def _moderation_rules(self, tier: str) -> str:
        """What moderation's verdicts depend on for this tier (its rules, its classifiers
        loaded): an answer checked under other rules is not served from the cache."""
        if self.moderation is None or not self.moderation.enabled:
            return "off"
        version = self.moderation.moderator.version
        return hashlib.sha256(f"{version}\0{tier}".encode()).hexdigest()[:16]

    async def erase(self, user_id: str, conv_ids: Sequence[str]) -> Erased:
        """Erase these conversations of the user (their answers stop first, their KV goes,
        and the semantic cache's answers first given in them)."""
        self.semantic.forget(conversations=conv_ids)
        return await erase_conversations(self.store, self.models, self._runs, user_id, conv_ids)

    async def forget_erased(self, conversations: Sequence[str], accounts: Sequence[str]) -> None:
        """Drop what this process holds in RAM of conversations and accounts that another
        process erased: their semantic cache answers, cached API answers and KV."""
        if conversations:
            self.semantic.forget(conversations=conversations)
            await forget_kv(self.models, conversations)
        for user_id in accounts:
            self.forget_answers_of(user_id)
            await self.forget_kv_of(user_id)

    async def forget_kv_of(self, scope: str) -> None:
        """Drop every KV of a scope (an erased account's) from the loaded engines."""
        await forget_scope_kv(self.models, scope)

    # -- reading -------------------------------------------------------------------------

    async def conversation(self, user: User, conv_id: str, act: Act = "read") -> Conversation:
        """The conversation if the user may `act` on it (404 unless they see it)."""
        return await conversation_for(self.store, user.id, conv_id, act)

    def conversation_model(self, user: User, conv: Conversation) -> str | None:
        """The model `conv` asks for on this user's turns: its own for its starter; in a
        workspace, another member's choice only within this user's tier."""
        if conv.workspace_id is None or conv.user_id == user.id:
            return conv.model
        return self.gate.router.inherited(user, conv.model)

    def expected_model(self, user: User, requested: str | None) -> str:
        """The model this user's next turn will most likely use (tier, pin, picked)."""
        return self.gate.router.expected(user, requested)

    def starters(self, model: str) -> list[Starter]:
        """The empty chat's starter prompts for `model`: those its catalogue entry names."""
        entry = self.catalogue(model) if self.catalogue is not None else None
        return starters_for(entry.starters if entry is not None else None)

    def resolve_model(self, requested: str | None) -> str:
        """The installed model a request names (default: the default model)."""
        return resolve_model(self.models, requested)

    async def view(
        self,
        user: User,
        conv_id: str,
        before: int | None = None,
        limit: int = 50,
        show: str | None = None,
    ) -> ConversationView:
        """The active branch, newest `limit` turns before `before`; `show` widens the page
        until that turn is on it (a search hit deep in a long chat). A `show` on another
        branch shows that branch (down to its newest leaf) for this view only: reading
        never switches the active branch (nor while an answer is running)."""
        conv = await self.conversation(user, conv_id)
        # The running answer is read before the turns: one that ends meanwhile is then
        # either still shown as running (its stream replays the end) or found among the
        # turns, never missing from both.
        running = self._runs.get(conv.id)
        if running is None and self.fronts is not None:
            running = await self.fronts.run_for(conv.id)
        path = await self.store.turns.path(conv.id, conv.active_leaf_id)
        if running is not None and any(t.id == running.turn_id for t in path):
            running = None  # written already: shown as a turn
        shown_leaf = None
        if (
            show
            and all(t.id != show for t in path)
            and conv.id not in self._runs
            and running is None
            and await self.store.turns.get(conv.id, show) is not None
        ):
            shown_leaf = await self.store.turns.deepest_leaf(conv.id, show)
            path = await self.store.turns.path(conv.id, shown_leaf)
        older = [t for t in path if before is None or t.seq < before]
        ids = [t.id for t in older]
        if show in ids:
            limit = max(limit, len(ids) - ids.index(show))
        page = older[-limit:] if limit > 0 else []
        siblings = await self.store.turns.sibling_ids(conv.id, {t.parent_id for t in page})
        model = self.expected_model(user, self.conversation_model(user, conv))
        engine = await self.models.engine(model)
        # The gauge counts what the next turn sends: the summary and the turns that fit.
        summary = await self.store.summaries.on_path(conv.id, [t.id for t in path])
        system, _, _ = await prompt_scope(self.store, conv)
        budget = history_budget(engine.info.n_ctx_per_seq, self.settings.max_tokens)
        # Tokenizing a long conversation is CPU work: off the event loop.
        window = await asyncio.to_thread(
            sent_window, system, summary, path, budget, engine.count_tokens
        )
        marks = await self._marks(conv.id, [t.id for t in page])
        answers = [t.id for t in page if t.role == "assistant"]
        ratings = await self.store.feedback.latest(user.id, answers)
        return ConversationView(
            conversation=conv,
            turns=[
                TurnView(t, siblings[t.parent_id], marks.get(t.id), ratings.get(t.id)) for t in page
            ],
            running=running,
            model=model,
            context_used=window.tokens,
            context_limit=engine.info.n_ctx_per_seq,
            next_cursor=page[0].seq if len(older) > len(page) else None,
            shown_leaf=shown_leaf,
            summary=summary,
            hidden_ids=window.hidden,
            summarising=self.summariser.busy(conv.id),
            may_configure=await may(self.store, user.id, conv, "configure"),
        )

    async def turn(self, user: User, conv_id: str, turn_id: str) -> Turn | None:
        """One turn of the user's conversation (None when there is no such turn)."""
        conv = await self.conversation(user, conv_id)
        return await self.store.turns.get(conv.id, turn_id)

    async def turn_view(self, user: User, conv_id: str, turn_id: str) -> TurnView | None:
        """One turn on its own (no sibling list) with its moderation mark."""
        turn = await self.turn(user, conv_id, turn_id)
        if turn is None:
            return None
        marks = await self._marks(turn.conversation_id, [turn.id])
        rating = (await self.store.feedback.latest(user.id, [turn.id])).get(turn.id)
        return TurnView(turn, [turn.id], marks.get(turn.id), rating)

    async def _marks(self, conv_id: str, turn_ids: list[str]) -> dict[str, ModerationMark]:
        """What moderation said of these turns; an item an admin dismissed marks nothing."""
        found: dict[str, list[ModerationMark]] = {}
        for item in await self.store.moderation.for_turns(conv_id, turn_ids):
            if item.turn_id is not None and item.status != "dismissed":
                mark = ModerationMark(item.action, item.category, item.status)
                found.setdefault(item.turn_id, []).append(mark)
        return {t: m for t, marks in found.items() if (m := strongest(marks)) is not None}

    def run_for(self, conv_id: str, turn_id: str | None = None) -> TurnRun | None:
        """The conversation's running answer, or a just-finished one by turn id."""
        run = self._runs.get(conv_id)
        if turn_id is None or (run is not None and run.turn_id == turn_id):
            return run
        done = self._finished.get(turn_id)
        return done if done is not None and done.conversation_id == conv_id else None

    async def find_run(self, conv_id: str, turn_id: str | None = None) -> TurnRun | None:
        """`run_for`, or the answer another front on the shared database writes here."""
        run = self.run_for(conv_id, turn_id)
        if run is None and self.fronts is not None:
            run = await self.fronts.run_for(conv_id, turn_id)
        return run
