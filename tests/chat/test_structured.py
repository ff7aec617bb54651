"""Reading tool calls out of streamed text, and the request checks for tools and formats."""

from __future__ import annotations

import json

import pytest

from chatbox.chat.errors import InvalidInput
from chatbox.chat.structured import (
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
