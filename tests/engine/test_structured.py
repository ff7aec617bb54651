"""Grammar-constrained sampling, logprobs, logit bias and n answers, on the tiny model.

The tiny model is random weights: whatever it writes under a grammar is as good a test of
the constraint as any, and it runs fast enough for a property test over schemas.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatbox.engine.engine import LlamaEngine
from chatbox.engine.tools import json_object_grammar, schema_grammar, tool_call_grammar
from chatbox.engine.types import (
    ChatMessage,
    DoneEvent,
    GenerationRequest,
    GrammarError,
    SamplingParams,
    TokenEvent,
    ToolSpec,
)
from tests.engine.conftest import TINY_SETTINGS
from tests.engine.helpers import assert_kv_consistent, chat, collect, wait_idle
from tests.tinymodel import SPECIAL_TOKENS, tiny_vocab

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


# -- a small JSON-schema checker for the shapes the strategy below makes -------------------
def conforms(value: Any, schema: dict[str, Any]) -> bool:
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema["type"]
    if kind == "object":
        props = schema["properties"]
        return (
            isinstance(value, dict)
            and set(value) <= set(props)
            and all(k in value for k in schema.get("required", []))
            and all(conforms(v, props[k]) for k, v in value.items())
        )
    if kind == "array":
        return (
            isinstance(value, list)
            and len(value) <= schema.get("maxItems", len(value))
            and all(conforms(v, schema["items"]) for v in value)
        )
    if kind == "string":
        # The random tiny model writes stray UTF-8 bytes; llama.cpp's grammar counts such a
        # byte as one character where Python shows a U+FFFD for each: count the rest.
        n = len(value.replace("\ufffd", "")) if isinstance(value, str) else 0
        return isinstance(value, str) and n <= schema.get("maxLength", n)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    raise AssertionError(kind)


names = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
leaves = st.one_of(
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 8)),
    st.just({"type": "integer"}),
    st.just({"type": "number"}),
    st.just({"type": "boolean"}),
    st.builds(
        lambda xs: {"type": "string", "enum": xs},
        st.lists(st.text("abcxyz ", min_size=1, max_size=5), min_size=1, max_size=4, unique=True),
    ),
)


def objects(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    def build(props: dict[str, dict[str, Any]], required: list[bool]) -> dict[str, Any]:
        keys = list(props)
        req = [k for k, r in zip(keys, required, strict=False) if r]
        return {
            "type": "object",
            "properties": props,
            "required": req,
            "additionalProperties": False,
        }

    return st.builds(
        build,
        st.dictionaries(names, children, min_size=1, max_size=6),
        st.lists(st.booleans(), min_size=6, max_size=6),
    )


def arrays(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(
        lambda items, n: {"type": "array", "items": items, "maxItems": n},
        children,
        st.integers(0, 2),
    )


# depth <= 3: an object of (leaves | objects/arrays of leaves | one more level)
level1 = st.one_of(leaves, arrays(leaves))
level2 = st.one_of(level1, objects(level1), arrays(objects(leaves)))
schemas = objects(level2)


@pytest.fixture(scope="module")
def engine_loop(tiny_gguf: Path) -> Any:
    """One engine for the whole property test (hypothesis runs many examples)."""
    loop = asyncio.new_event_loop()
    engine = LlamaEngine(tiny_gguf, "tiny", TINY_SETTINGS)
    loop.run_until_complete(engine.start())
    yield engine, loop
    loop.run_until_complete(engine.stop())
    engine.close()
    loop.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=schemas, seed=st.integers(0, 2**31))
def test_schema_constrained_answers_always_validate(
    engine_loop: Any, schema: dict[str, Any], seed: int
) -> None:
    engine, loop = engine_loop
    sampling = SamplingParams(
        temperature=1.0, seed=seed, max_tokens=900, grammar=schema_grammar(schema)
    )

    async def run() -> Any:
        return await collect(engine.submit(GenerationRequest(chat("x"), sampling)))

    result = loop.run_until_complete(run())
    assert result.done.finish_reason == "stop", result.text
    value = json.loads(result.text)
    assert conforms(value, schema), (value, schema)


async def test_json_object_grammar_gives_an_object(tiny_engine: LlamaEngine) -> None:
    """Every answer that ends is an object (a random model nests some past max_tokens).

    No top-k/top-p/min-p: the grammar then samples from the model's own distribution over
    what it allows, whether it filters the vocabulary or checks the pick."""
    ended = 0
    for seed in range(4):
        sampling = SamplingParams(
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            min_p=0.0,
            seed=seed,
            max_tokens=400,
            grammar=json_object_grammar(),
        )
        result = await collect(tiny_engine.submit(GenerationRequest(chat("hi"), sampling)))
        if result.done.finish_reason == "stop":
            ended += 1
            assert isinstance(json.loads(result.text), dict), result.text
        else:
            assert result.text.startswith("{"), result.text
    assert ended


async def test_tool_call_grammar_names_a_tool_and_its_arguments_validate(
    tiny_engine: LlamaEngine,
) -> None:
    params = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer"}},
        "required": ["city", "days"],
        "additionalProperties": False,
    }
    tools = (ToolSpec("forecast", "weather", json.dumps(params)), ToolSpec("noop"))
    sampling = SamplingParams(
        temperature=1.0, seed=7, max_tokens=300, grammar=tool_call_grammar(tools, "forecast")
    )
    result = await collect(tiny_engine.submit(GenerationRequest(chat("go"), sampling, tools=tools)))
    assert result.text.startswith("<tool_call>\n") and result.text.endswith("\n</tool_call>")
    call = json.loads(result.text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
    assert call["name"] == "forecast" and conforms(call["arguments"], params)


async def test_a_long_max_length_holds_at_default_sampling(tiny_engine: LlamaEngine) -> None:
    """A string's maxLength well past a few dozen (a search query's 200) is enforced, so a
    model stuck repeating one character still closes its string and ends the call."""
    params = {
        "type": "object",
        "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 200}},
        "required": ["query"],
        "additionalProperties": False,
    }
    tools = (ToolSpec("search_library", "search", json.dumps(params)),)
    grammar = tool_call_grammar(tools, None, 1500)
    assert "{1,200}" in grammar
    for seed in range(4):
        sampling = SamplingParams(seed=seed, max_tokens=1500, grammar=grammar)
        result = await collect(tiny_engine.submit(GenerationRequest(chat("otters"), sampling)))
        assert result.done.finish_reason == "stop", result.text
        call = json.loads(result.text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
        assert conforms(call["arguments"], params), call


async def test_parallel_tool_call_grammar_gives_several_calls_and_single_gives_one(
    tiny_engine: LlamaEngine,
) -> None:
    """With its end tokens banned the tiny model goes on to a second call under the parallel
    grammar; under the single-call grammar the grammar ends the answer all the same."""
    params = {"type": "object", "properties": {"city": {"enum": ["Paris", "London"]}}}
    params["required"] = ["city"]
    tools = (ToolSpec("get_weather", "weather", json.dumps(params)),)
    tagged = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)
    no_end = tuple((tiny_vocab()[0].index(t), -100.0) for t in SPECIAL_TOKENS)
    for parallel, calls in ((True, 2), (False, 1)):
        grammar = tool_call_grammar(tools, None, 300, parallel=parallel)
        sampling = SamplingParams(
            temperature=1.0, seed=3, max_tokens=300, grammar=grammar, logit_bias=no_end
        )
        result = await collect(tiny_engine.submit(GenerationRequest(chat("go"), sampling)))
        found = [json.loads(m) for m in tagged.findall(result.text)]
        assert len(found) >= calls if parallel else len(found) == 1, result.text
        assert all(c["name"] == "get_weather" for c in found)
        assert all(c["arguments"]["city"] in ("Paris", "London") for c in found)
        assert parallel or result.done.finish_reason == "stop"
        assert result.text.startswith("<tool_call>\n")


async def test_a_broken_grammar_is_refused_before_queueing(tiny_engine: LlamaEngine) -> None:
    with pytest.raises(GrammarError):
        tiny_engine.submit(GenerationRequest(chat("x"), SamplingParams(grammar='root ::= "a')))


async def test_logprobs_are_log_probabilities_with_sorted_top_lists(
    tiny_engine: LlamaEngine,
) -> None:
    k = 5
    sampling = SamplingParams(temperature=1.0, seed=11, max_tokens=24, logprobs=k)
    gen = tiny_engine.submit(GenerationRequest(chat("hello there"), sampling))
    entries = []
    async for event in gen:
        if isinstance(event, TokenEvent):
            entries += event.logprobs
    assert len(entries) == 24
    for e in entries:
        assert e.logprob <= 0.0
        tops = [p for _, p in e.top]
        assert len(tops) == k and tops == sorted(tops, reverse=True)
        if e.logprob > tops[-1]:  # it ranks in the top k, so it is listed there
            assert (e.piece, e.logprob) in e.top
    # Temperature 1 samples below the top token sometimes: the check above is exercised.
    assert any(e.logprob < e.top[0][1] for e in entries)


async def test_logit_bias_bans_and_forces_tokens(tiny_engine: LlamaEngine) -> None:
    first = await collect(tiny_engine.submit(GenerationRequest(chat("q"), GREEDY)))
    top_token = tiny_engine.model.tokenize(first.chunks[0])[0]
    banned = SamplingParams(temperature=0.0, max_tokens=24, logit_bias=((top_token, -100.0),))
    again = await collect(tiny_engine.submit(GenerationRequest(chat("q"), banned)))
    assert top_token not in tiny_engine.model.tokenize(again.text)
    forced = tiny_engine.model.tokenize("Z")[0]
    push = SamplingParams(temperature=0.0, max_tokens=4, logit_bias=((forced, 100.0),))
    pushed = await collect(tiny_engine.submit(GenerationRequest(chat("q"), push)))
    assert pushed.text == "ZZZZ"


async def test_n_answers_share_one_prefill(tiny_engine: LlamaEngine) -> None:
    await wait_idle(tiny_engine)
    await tiny_engine.clear_cache()
    prompt = chat("tell me a story " * 40)
    n_prompt = tiny_engine.count_tokens(prompt)
    miss = tiny_engine.metrics.cache_miss
    before = miss._value.get()
    sampling = SamplingParams(temperature=1.0, seed=1, max_tokens=12)
    gen = tiny_engine.submit(GenerationRequest(prompt, sampling, n=4))
    texts: dict[int, str] = {}
    done: DoneEvent | None = None
    async for event in gen:
        if isinstance(event, TokenEvent):
            texts[event.index] = texts.get(event.index, "") + event.text
        else:
            done = event
    assert done is not None and done.finish_reasons == ("length",) * 4
    assert sorted(texts) == [0, 1, 2, 3]
    assert len(set(texts.values())) > 1  # own seeds: the answers differ
    assert done.usage.prompt_tokens == n_prompt and done.usage.completion_tokens == 48
    assert miss._value.get() - before == n_prompt  # prefilled once, not four times
    await wait_idle(tiny_engine)
    await assert_kv_consistent(tiny_engine)


async def test_cancelling_n_answers_stops_them_all(tiny_engine: LlamaEngine) -> None:
    sampling = SamplingParams(temperature=1.0, seed=1, max_tokens=400)
    gen = tiny_engine.submit(GenerationRequest(chat("go on"), sampling, n=3))
    async for event in gen:
        if isinstance(event, TokenEvent):
            gen.cancel()
        elif isinstance(event, DoneEvent):
            assert event.finish_reason == "cancelled"
    await wait_idle(tiny_engine)
    await assert_kv_consistent(tiny_engine)


def test_tool_results_reach_a_template_without_tools_as_user_messages(
    tiny_engine: LlamaEngine,
) -> None:
    from chatbox.engine.types import ToolCall

    tools = (ToolSpec("lookup", "find a word", '{"type": "object", "properties": {}}'),)
    messages = (
        ChatMessage("user", "define cat"),
        ChatMessage("assistant", "", tool_calls=(ToolCall("c1", "lookup", '{"w": "cat"}'),)),
        ChatMessage("tool", "a small feline", tool_call_id="c1", name="lookup"),
    )
    text = tiny_engine.template.render(messages, tools=tools)
    assert '"name": "lookup"' in text and "You can call functions" in text
    assert '<tool_call>\n{"name": "lookup", "arguments": {"w": "cat"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>" in text and "a small feline" in text


async def test_an_enum_grammar_gives_exactly_its_values(tiny_engine: LlamaEngine) -> None:
    """Values that share prefixes or hold a quote or a backslash (written as a trie)."""
    values: list[Any] = ["US", "USA", "UK", 'a"b', "back\\slash", "", 1, 12, None, {"k": [1]}]
    grammar = schema_grammar({"enum": values})
    seen = []
    for seed in range(12):
        sampling = SamplingParams(temperature=1.0, seed=seed, max_tokens=40, grammar=grammar)
        result = await collect(tiny_engine.submit(GenerationRequest(chat("x"), sampling)))
        assert result.done.finish_reason == "stop", result.text
        seen.append(json.loads(result.text))
        assert seen[-1] in values, result.text
    assert len({json.dumps(v) for v in seen}) > 1  # a choice among them, not one path
