"""Memory extraction samples under a grammar: whatever the model, its answer parses as facts.

The tiny model has random weights, so without the grammar its output is noise (the control
below); with it, every answer is "- none" or whole "- The user ..." lines.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from chatbox.engine.engine import LlamaEngine
from chatbox.engine.types import ChatMessage, Engine, GenerationRequest, SamplingParams, TokenEvent
from chatbox.knowledge.extraction import (
    EXAMPLES,
    FACT_CHARS,
    MAX_FACTS,
    SYSTEM,
    Extractor,
    grounded_facts,
)
from chatbox.settings import EngineSettings
from tests.engine.helpers import running

# The grammar bounds a fact to FACT_CHARS code points as llama.cpp reads the bytes; a random
# model's invalid UTF-8 decodes to several U+FFFD each here, so the bound is looser below.
FACT = rf"- The user [^\x00-\x1F\x7F]{{2,{4 * FACT_CHARS}}}"
ANSWER = re.compile(rf"- none|{FACT}(?:\n{FACT}){{0,{MAX_FACTS - 1}}}")
INPUTS = (
    "I'm a nurse and I always cycle to work. How do I fix a flat tyre?",
    "What is 2+2?",
    "My name is Ada, I live in Lisbon and I write Rust at a bank.",
    "ünïcödé 東京 🚲 — and a very long line " * 8,
    "",
)


@pytest.fixture
async def tiny(tiny_gguf: Path) -> AsyncIterator[LlamaEngine]:
    settings = EngineSettings(n_parallel=2, n_ctx=2048, n_ctx_per_seq=1024, n_threads=1)
    async with running(tiny_gguf, settings) as engine:
        yield engine


def extractor(engine: Engine, max_tokens: int) -> Extractor:
    async def source() -> Engine:
        return engine

    ex = Extractor(None, None, source, 60.0)  # type: ignore[arg-type]  # only the model is used
    ex.max_tokens = max_tokens
    return ex


async def test_every_answer_of_a_random_model_parses_as_fact_lines(tiny: LlamaEngine) -> None:
    ex = extractor(tiny, 900)  # room for the longest answer the grammar allows: never cut
    for text in INPUTS:
        answer = await ex.ask_model(text)
        assert ANSWER.fullmatch(answer), (text, answer)
        grounded_facts(answer, text)  # and the reader takes it as it is


async def test_a_cut_answer_keeps_whole_lines_only(tiny: LlamaEngine) -> None:
    ex = extractor(tiny, 40)  # shorter than one random line: the cut part is dropped
    for text in INPUTS[:3]:
        answer = await ex.ask_model(text)
        assert answer == "" or all(re.fullmatch(FACT, line) for line in answer.splitlines())


async def test_without_the_grammar_the_same_model_writes_noise(tiny: LlamaEngine) -> None:
    """The control: the shape above comes from the grammar, not from the model."""
    messages = (ChatMessage("system", SYSTEM), *EXAMPLES, ChatMessage("user", INPUTS[0]))
    request = GenerationRequest(messages, SamplingParams(temperature=0.0, max_tokens=60))
    out = [e.text async for e in tiny.submit(request) if isinstance(e, TokenEvent)]
    assert not ANSWER.fullmatch("".join(out))
