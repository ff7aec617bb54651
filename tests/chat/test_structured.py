"""Reading tool calls out of streamed text, and the request checks for tools and formats."""

from __future__ import annotations

import json
import threading
import time

import pytest

from chatbox.chat.errors import InvalidInput, Overloaded
from chatbox.chat.stateless import structured
from chatbox.chat.stateless.structured import (
    CallReader,
    response_constraint,
    tool_choice_in,
    tool_constraint,
    tools_in,
)

ARGS = '{"city": "Paris \\"5e\\"", "n": [1, {"a": "}"}]}'
CALL = f'<tool_call>\n{{"name": "get_weather", "arguments": {ARGS}}}\n</tool_call>'


def read(text: str, cut: int) -> tuple[str, list[dict[str, str]], list[str]]:
    """Feed text in pieces of `cut` characters; return content, calls, and piece kinds."""
    reader = CallReader()
    pieces = []
    for i in range(0, len(text), cut):
        pieces += reader.feed(text[i : i + cut])
    pieces += reader.finish()
    content = "".join(p.text for p in pieces if p.kind == "content")
    args: dict[int, str] = {}
    names: dict[int, str] = {}
    for p in pieces:
        if p.kind == "call":
            names[p.index] = p.name
            args[p.index] = ""
        elif p.kind == "arguments":
            args[p.index] += p.text
    calls = [{"name": names[i], "arguments": args[i]} for i in sorted(names)]
    return content, calls, [p.kind for p in pieces]


@pytest.mark.parametrize("cut", [1, 2, 3, 5, 8, 13, 1000])
def test_streamed_pieces_reassemble_to_the_call(cut: int) -> None:
    content, calls, kinds = read("Let me check. " + CALL, cut)
    assert content == "Let me check. "
    assert [c["name"] for c in calls] == ["get_weather"]
    assert json.loads(calls[0]["arguments"]) == {"city": 'Paris "5e"', "n": [1, {"a": "}"}]}
    assert kinds.count("call") == 1


def test_plain_text_passes_through_even_with_a_partial_tag() -> None:
    content, calls, _ = read("a < b and <tool is not a call", 1)
    assert content == "a < b and <tool is not a call" and calls == []


def test_two_calls_in_a_row() -> None:
    other = CALL.replace("get_weather", "get_time")
    _, calls, _ = read(CALL + "\n" + other, 4)
    assert [c["name"] for c in calls] == ["get_weather", "get_time"]


@pytest.mark.parametrize("cut", [1, 4, 1000])
def test_a_repeated_call_ends_the_answer_and_is_dropped(cut: int) -> None:
    other = CALL.replace("get_weather", "get_time")
    reader = CallReader()
    kinds = []
    text = CALL + "\n" + other + "\n" + CALL.replace(": ", ":") + "\n" + other
    for i in range(0, len(text), cut):
        kinds += [p.kind for p in reader.feed(text[i : i + cut])]
    assert [c["name"] for c in reader.calls] == ["get_weather", "get_time"]
    assert reader.repeated and kinds.count("repeat") == 1 and kinds.count("end") == 2


@pytest.mark.parametrize("cut", [1, 2, 3, 7, 1000])
def test_arguments_never_begin_with_whitespace(cut: int) -> None:
    spaced = '<tool_call>\n{"name": "f", "arguments": \n  {"a": 1}}\n</tool_call>'
    _, calls, _ = read(spaced + "\n" + spaced, cut)
    assert [c["arguments"] for c in calls] == ['{"a": 1}', '{"a": 1}']


def test_tool_choice_and_tools_are_checked() -> None:
    tools = tools_in([{"type": "function", "function": {"name": "f", "parameters": {}}}])
    assert tool_choice_in(None, tools) == ("auto", None)
    assert tool_choice_in({"type": "function", "function": {"name": "f"}}, tools) == (
        "required",
        "f",
    )
    with pytest.raises(InvalidInput) as e:
        tool_choice_in({"type": "function", "function": {"name": "g"}}, tools)
    assert e.value.param == "tool_choice"
    with pytest.raises(InvalidInput) as e:
        tool_choice_in("required", ())
    assert e.value.param == "tool_choice"
    with pytest.raises(InvalidInput) as e:
        tools_in([{"type": "function", "function": {"name": "bad name"}}])
    assert e.value.param == "tools[0].function.name"
    auto = tool_constraint(tools, "auto", None)
    assert auto.grammar and auto.triggers  # lazy: free text until a call opens
    assert not tool_constraint(tools, "required", None).triggers


def test_response_formats() -> None:
    assert response_constraint({"type": "text"}).grammar is None
    assert response_constraint({"type": "json_object"}).grammar
    with pytest.raises(InvalidInput) as e:
        response_constraint({"type": "xml"})
    assert e.value.param == "response_format.type"
    with pytest.raises(InvalidInput) as e:
        response_constraint({"type": "json_schema", "json_schema": {"schema": {}}})
    assert e.value.param == "response_format"


# -- schemas whose numbers would make a huge grammar ---------------------------------------
def schema_format(schema: dict[str, object]) -> dict[str, object]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def prop(schema: dict[str, object]) -> dict[str, object]:
    return {"type": "object", "properties": {"a": schema}, "required": ["a"]}


def refused(schema: dict[str, object], max_tokens: int = 512) -> InvalidInput:
    with pytest.raises(InvalidInput) as e:
        response_constraint(schema_format(schema), max_tokens)
    return e.value


def test_size_keywords_an_answer_cannot_hold_are_refused_naming_their_path() -> None:
    huge = refused(prop({"type": "array", "minItems": 100_000_000, "items": {"type": "string"}}))
    assert huge.param == "response_format.json_schema.schema.properties.a.minItems"
    assert "max_tokens" in str(huge)
    tool = {"type": "string", "minLength": 99_999_999}
    with pytest.raises(InvalidInput) as e:
        tools_in([{"type": "function", "function": {"name": "f", "parameters": prop(tool)}}])
    assert e.value.param == "tools[0].function.parameters.properties.a.minLength"
    # 300 strings of at least 100 characters: too long for 512 tokens, not for 4096
    many = prop({"type": "array", "minItems": 300, "items": {"type": "string", "minLength": 100}})
    assert refused(many).param == "response_format.json_schema.schema.properties.a.minItems"
    assert response_constraint(schema_format(many), 4096).grammar


def test_a_huge_upper_bound_is_written_unbounded_a_small_one_kept() -> None:
    huge = response_constraint(schema_format(prop({"type": "string", "maxLength": 10**9})))
    assert huge.grammar and len(huge.grammar) < 1000 and "char*" in huge.grammar
    small = response_constraint(schema_format(prop({"type": "string", "maxLength": 40})))
    assert small.grammar and "char{0,40}" in small.grammar  # llama.cpp's own repetition


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"enum": list(range(1001))}, "enum"),
        ({"anyOf": [{"const": i} for i in range(129)]}, "anyOf"),
        ({"type": "object", "properties": {f"p{i}": {} for i in range(101)}}, "properties"),
        (prop({"type": "string", "pattern": "^a{0,3000}$"}), "properties.a.pattern"),
        (prop({"type": "string", "minLength": 2001}), "properties.a.minLength"),
        (prop({"type": "string", "minLength": 1.5}), "properties.a.minLength"),
        (prop({"type": "array", "items": {}, "maxItems": -1}), "properties.a.maxItems"),
        ({"$ref": "https://example.com/s.json"}, "$ref"),
    ],
)
def test_schemas_past_the_grammar_limits_are_refused(schema: dict[str, object], where: str) -> None:
    assert refused(schema, 100_000).param == f"response_format.json_schema.schema.{where}"


def test_a_pattern_counts_its_shortest_match_and_its_nested_repeats() -> None:
    nested = prop({"type": "string", "pattern": "^(a{1000}){1000}$"})
    for max_tokens in (512, 100_000):  # a million characters, and a million spelled out
        assert refused(nested, max_tokens).param == (
            "response_format.json_schema.schema.properties.a.pattern"
        )
    # each repeat alone is small, but an answer of 512 tokens cannot hold their product
    long = prop({"type": "string", "pattern": "^(ab{150}){120}$"})
    assert "max_tokens" in str(refused(long))
    for fine in ("^[a-z]{1,64}(\\.[a-z]{1,64}){0,10}$", "^.*$", "^(a|b)+c?$"):
        assert response_constraint(schema_format(prop({"type": "string", "pattern": fine})))


def test_references_and_all_of_count_what_their_targets_need() -> None:
    big = {"type": "string", "minLength": 1000}
    names = [f"p{i}" for i in range(20)]
    chain: dict[str, object] = {  # 20 required properties through a chain of two references
        "$defs": {"big": big, "alias": {"$ref": "#/$defs/big"}},
        "type": "object",
        "properties": {name: {"$ref": "#/$defs/alias"} for name in names},
        "required": names,
    }
    assert refused(chain).param == "response_format.json_schema.schema.required"
    assert response_constraint(schema_format(chain), 4096).grammar
    both = {
        "allOf": [
            {"type": "object", "properties": {"a": big}, "required": ["a"]},
            {"type": "object", "properties": {"b": big}, "required": ["b"]},
        ]
    }
    assert refused(both, 40).param == "response_format.json_schema.schema.allOf"
    # a recursion every answer must go through never ends; an optional one is a tree
    endless = {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}
    assert refused(endless).param == "response_format.json_schema.schema.properties.next.$ref"
    kids = {"type": "array", "items": {"$ref": "#/$defs/node"}}
    node = {"type": "object", "properties": {"kids": kids}, "required": ["kids"]}
    tree = {"$defs": {"node": node}, **prop({"$ref": "#/$defs/node"})}
    assert response_constraint(schema_format(tree)).grammar


def test_a_left_recursive_reference_is_refused_naming_its_parameter() -> None:
    left = {
        "$defs": {"e": {"anyOf": [{"$ref": "#/$defs/e"}, {"type": "string"}]}},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/e"}},
        "required": ["a"],
    }
    with pytest.raises(InvalidInput) as e:
        tools_in([{"type": "function", "function": {"name": "f", "parameters": left}}])
    assert (e.value.param or "").startswith("tools[0].function.parameters.")
    assert "left recursion" in str(e.value)
    param = refused(left).param or ""
    assert param.startswith("response_format.json_schema.schema.") and param.endswith("$ref")


def test_nesting_past_the_limit_is_refused_at_its_depth() -> None:
    schema: dict[str, object] = {"type": "string"}
    for _ in range(30):
        schema = prop(schema)
    param = refused(schema).param or ""  # 24 levels below the root pass; the 25th does not
    assert param.endswith(".properties") and param.count("properties.a") == 25


async def test_grammars_are_built_off_the_event_loop_within_a_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop_thread = threading.get_ident()
    assert await structured.off_loop(threading.get_ident) != loop_thread
    monkeypatch.setattr(structured, "BUILD_TIMEOUT_S", 0.05)
    with pytest.raises(Overloaded):
        await structured.off_loop(lambda: time.sleep(0.5))
