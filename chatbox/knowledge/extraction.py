"""Facts extracted from a conversation once it goes quiet, by the model, at low priority.

The model's lines are kept only where they are grounded in what the user wrote (small models
invent); plain first-person statements ("I work on …") are taken directly as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable

from chatbox.engine.types import (
    ChatMessage,
    DoneEvent,
    Engine,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from chatbox.knowledge.errors import NotKept
from chatbox.knowledge.memory import MemoryService, clean_fact
from chatbox.store import Store

log = logging.getLogger("chatbox.knowledge")
EXTRACTION_PRIORITY = 10  # below every live chat; never takes a conversation's cached prefix
MAX_FACTS = 8
EXTRACT_HOLD_S = 300.0  # a claim on a conversation's extraction, should its front die mid-way
GROUNDED = 0.75  # share of a fact's content words the user must have written

SYSTEM = (
    "You write down lasting facts about the user: their preferences, job, projects, tools, "
    'location, name. Write each fact on its own line starting with "- The user". '
    'Only use what the user said. If there are none, write "- none".'
)
EXAMPLES = (
    ChatMessage(
        "user", "User said: I'm a nurse and I always cycle to work. How do I fix a flat tyre?"
    ),
    ChatMessage("assistant", "- The user is a nurse\n- The user cycles to work"),
    ChatMessage("user", "User said: What is 2+2?"),
    ChatMessage("assistant", "- none"),
)
_STOP_WORDS = """a an the and or but of to in on at for with from by about as is are was were be
been am i i'm me my mine you your user user's users they them their it its this that these
those there here what which who whom how why when where do does did not no yes so very just
also please can could would should will shall may might must have has had get got like
really always never"""
_STOP = frozenset(_STOP_WORDS.split())
_FIRST_PERSON = re.compile(
    r"\b(?:I am|I'm|my name is|I work|I live|I prefer|I use|I like|I love|I hate|I have|"
    r"I own|I study|I speak|my [a-z]+(?: [a-z]+)? is)\b[^.?!\n]*",
    re.IGNORECASE,
)
EngineSource = Callable[[], Awaitable[Engine]]
FACT_CHARS = 100  # the longest fact the model may write
# The answer's shape, enforced while sampling: "- none", or up to MAX_FACTS lines that each
# start "- The user" (no preamble, no prose, no numbering), so every line parses as a fact.
FACTS_GRAMMAR = f"""
root ::= "- none" | fact ("\\n" fact){{0,{MAX_FACTS - 1}}}
fact ::= "- The user " [^\\x00-\\x1F\\x7F]{{2,{FACT_CHARS}}}
"""


def _words(text: str) -> set[str]:
    out = set()
    for w in re.findall(r"[a-z0-9]+", text.lower()):
        if w in _STOP or len(w) < 3:
            continue
        out.add(w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w)
    return out


def grounded_facts(output: str, user_text: str) -> list[str]:
    """Lines of the model's output that the user's own words support."""
    said = _words(user_text)
    facts = []
    for line in output.splitlines():
        for clause in re.split(r",\s*which\b|,\s*but\b|\band\b|;|\.\s", line):
            fact = clean_fact(clause)
            words = _words(fact)
            if fact.lower().startswith("none") or len(words) < 2:
                continue
            if len(words & said) / len(words) >= GROUNDED:
                facts.append(_third_person(fact))
    return facts[:MAX_FACTS]


def _third_person(fact: str) -> str:
    """'I prefer metric units' → 'The user prefers metric units' (simple, English only)."""
    s = fact.strip()
    s = re.sub(r"^(?:I am|I'm)\b", "The user is", s, flags=re.IGNORECASE)
    s = re.sub(r"^my\b", "The user's", s, flags=re.IGNORECASE)

    def verb(m: re.Match[str]) -> str:
        v = m.group(1).lower()
        if v == "have":
            return "The user has"
        if re.search(r"(s|sh|ch|x|o)$", v):
            return f"The user {v}es"
        if re.search(r"[^aeiou]y$", v):
            return f"The user {v[:-1]}ies"
        return f"The user {v}s"

    s = re.sub(r"^I ([a-z]+)\b", verb, s, flags=re.IGNORECASE)
    if not s.lower().startswith(("the user", "user")):
        return s
    return s[0].upper() + s[1:]


def stated_facts(user_text: str) -> list[str]:
    """First-person statements the user made ("I work on the billing service")."""
    facts = []
    for sentence in re.split(r"(?<=[.?!])\s+|\n+", user_text):
        if sentence.rstrip().endswith("?"):
            continue
        for clause in re.split(
            r",\s*(?:please|and|but|so)?\s*|\s+(?:and|but)\s+(?=I\b|my\b)",
            sentence,
            flags=re.IGNORECASE,
        ):
            m = _FIRST_PERSON.match(clause.strip())
            if m is None:
                continue
            fact = re.sub(r"(?<=.)\bmy\b", "their", clean_fact(m.group(0)), flags=re.IGNORECASE)
            if len(_words(fact)) >= 2:
                facts.append(_third_person(fact))
    return facts[:MAX_FACTS]


class Extractor:
    """Arms an idle timer per conversation; when it fires, reads new user turns for facts."""

    max_tokens = 160  # of the model's answer; a real model writes "- none" or a few lines

    def __init__(
        self, store: Store, memory: MemoryService, engine: EngineSource, idle_s: float
    ) -> None:
        self.store = store
        self.memory = memory
        self.engine = engine
        self.idle_s = idle_s
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[list[str]]] = set()

    def touch(self, user_id: str, conversation_id: str) -> None:
        """The conversation was active now; extraction waits until it has been quiet."""
        timer = self._timers.pop(conversation_id, None)
        if timer is not None:
            timer.cancel()
        loop = asyncio.get_running_loop()
        self._timers[conversation_id] = loop.call_later(
            self.idle_s, self._fire, user_id, conversation_id
        )

    def _fire(self, user_id: str, conversation_id: str) -> None:
        self._timers.pop(conversation_id, None)
        task = asyncio.create_task(self.extract(user_id, conversation_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def extract(self, user_id: str, conversation_id: str) -> list[str]:
        """Extract and store facts from user turns not read yet; returns the facts stored."""
        try:
            return await self._extract(user_id, conversation_id)
        except asyncio.CancelledError:
            raise
        except NotKept:  # the user's zero-data-retention: nothing is remembered
            return []
        except Exception:  # background work: log it, never take the app down
            log.exception("memory extraction failed for %s", conversation_id)
            return []

    async def _extract(self, user_id: str, conversation_id: str) -> list[str]:
        if not await self.memory.enabled(user_id):
            return []
        job = f"extract:{conversation_id}"
        if not await self.store.jobs.claim(job, EXTRACT_HOLD_S):
            return []  # another front is reading this conversation now
        try:
            return await self._extract_claimed(user_id, conversation_id)
        finally:
            await self.store.jobs.done(job)

    async def _extract_claimed(self, user_id: str, conversation_id: str) -> list[str]:
        conv = await self.store.conversations.get(user_id, conversation_id)
        if conv is None:
            return []
        after = await self.store.memories.extracted_upto(conversation_id)
        path = await self.store.turns.path(conv.id, conv.active_leaf_id)
        new = [t for t in path if t.seq > after]
        said = [t.content for t in new if t.role == "user"]
        if not new:
            return []
        text = "\n".join(said)
        facts = stated_facts(text)
        if said:
            output = await self.ask_model(text)
            facts += grounded_facts(output, text)
        unique = list(dict.fromkeys(facts))
        changes = await self.memory.add(user_id, unique, "extracted", conversation_id)
        await self.store.memories.mark_extracted(conversation_id, max(t.seq for t in new))
        return [c.memory.text for c in changes]

    async def ask_model(self, user_text: str) -> str:
        """The model's fact lines for what the user said (whole lines only), by the grammar."""
        engine = await self.engine()
        budget = engine.info.n_ctx_per_seq // 2
        excerpt = user_text[-4 * budget :]  # recent words first; a rough char→token bound
        messages = (
            ChatMessage("system", SYSTEM),
            *EXAMPLES,
            ChatMessage("user", f"User said: {excerpt}"),
        )
        request = GenerationRequest(
            messages,
            SamplingParams(temperature=0.0, max_tokens=self.max_tokens, grammar=FACTS_GRAMMAR),
            cache_key=None,
            priority=EXTRACTION_PRIORITY,
            shared_messages=len(messages) - 1,
        )  # ours, not typed
        out = []
        cut = False
        async for event in engine.submit(request):
            if isinstance(event, TokenEvent):
                out.append(event.text)
            elif isinstance(event, DoneEvent):
                cut = event.finish_reason == "length"
        text = "".join(out)
        # Cut off by max_tokens: the last line may stop mid-fact, so only whole lines count.
        return text[: text.rfind("\n") + 1] if cut else text

    async def shutdown(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
