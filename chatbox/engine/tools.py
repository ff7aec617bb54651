"""Function calling and structured output: the prompt format for models whose chat template
does not know tools, and llama.cpp grammars (GBNF) built from JSON schemas.

A call is always written `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
(the Hermes format that Qwen and Hermes templates teach natively). A template that renders
`tools` itself describes them in its own words; any other model gets `tool_system_text`
in its system message, its earlier calls as that text, and tool results as user messages
wrapped in `<tool_response>`. The grammar makes the call parse whatever the model learned.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from chatbox.engine.schema_bounds import (
    MAX_GRAMMAR_CHARS,
    SchemaBudget,
    SchemaTooLarge,
    bound_schema,
)
from chatbox.engine.types import ChatMessage, ToolCall, ToolSpec

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
# Lazy grammars wait for this (llama.cpp matches the whole text so far; the grammar then
# applies from group 1, the opening tag, on).
CALL_TRIGGER = r"[\s\S]*?(<tool_call>)[\s\S]*"
DEFAULT_MAX_TOKENS = 4096  # the answer budget a schema is checked against when none is given


def tool_dicts(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Tools as OpenAI's request shape (what Jinja chat templates expect)."""
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": json.loads(t.parameters),
            },
        }
        for t in tools
    ]


def call_text(call: ToolCall) -> str:
    try:
        args: Any = json.loads(call.arguments)
    except ValueError:
        args = call.arguments
    body = json.dumps({"name": call.name, "arguments": args}, ensure_ascii=False)
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"


def tool_system_text(tools: Sequence[ToolSpec]) -> str:
    lines = [
        "You can call functions. To call one, reply with only this, and nothing else:",
        f'{CALL_OPEN}\n{{"name": <function name>, "arguments": <arguments as a JSON object>}}'
        f"\n{CALL_CLOSE}",
        "A function's result comes back in <tool_response></tool_response>; then answer the"
        " user with it. The functions:",
    ]
    for t in tools:
        spec = {"name": t.name, "description": t.description, "parameters": t.parameters}
        spec["parameters"] = json.loads(t.parameters)
        lines.append(json.dumps(spec, ensure_ascii=False))
    return "\n".join(lines)


def fallback_messages(
    messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
) -> list[ChatMessage]:
    """The documented tool format as plain system/user/assistant messages."""
    out: list[ChatMessage] = []
    for m in messages:
        if m.role == "tool":
            body = json.dumps({"name": m.name or "", "content": m.content}, ensure_ascii=False)
            text = f"<tool_response>\n{body}\n</tool_response>"
            if out and out[-1].role == "user" and out[-1].content.startswith("<tool_response>"):
                out[-1] = ChatMessage("user", f"{out[-1].content}\n{text}")
            else:
                out.append(ChatMessage("user", text))
        elif m.tool_calls:
            calls = "\n".join(call_text(c) for c in m.tool_calls)
            out.append(ChatMessage("assistant", f"{m.content}\n{calls}".strip()))
        else:
            out.append(ChatMessage(m.role, m.content))
    if tools:
        text = tool_system_text(tools)
        if out and out[0].role == "system":
            out[0] = ChatMessage("system", f"{out[0].content}\n\n{text}")
        else:
            out.insert(0, ChatMessage("system", text))
    return out


def native_message(m: ChatMessage) -> dict[str, Any]:
    """A message as Jinja templates that know tools read it (arguments as an object)."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": _loads_or_text(c.arguments)},
            }
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def _loads_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


# -- grammars ----------------------------------------------------------------------------


def schema_grammar(
    schema: dict[str, Any], prop_order: Sequence[str] = (), max_tokens: int = DEFAULT_MAX_TOKENS
) -> str:
    """GBNF (root rule `root`) for JSON matching the schema; ValueError if unsupported,
    SchemaTooLarge (a ValueError) if its numbers exceed what `max_tokens` or a grammar hold."""
    return convert_schema(bound_schema(schema, SchemaBudget(max_tokens)), prop_order)


def convert_schema(schema: dict[str, Any], prop_order: Sequence[str] = ()) -> str:
    """GBNF for a schema `bound_schema` returned (only such a one: others may not end).

    llama-cpp-python's converter (a port of llama.cpp's) is pure Python; imported here so
    that importing this module does not load llama.cpp.
    """
    try:
        grammar = _converter(schema, prop_order)
    except Exception as exc:  # the converter raises bare Exceptions on schemas it lacks
        raise ValueError(f"unsupported JSON schema: {exc}") from exc
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise SchemaTooLarge(
            "",
            "",
            f"its grammar would be {len(grammar):,} characters; at most {MAX_GRAMMAR_CHARS:,}",
        )
    # This converter's string character admits raw control characters, which JSON forbids
    # (json.loads refuses them): use llama.cpp's own rule.
    return re.sub(r"^char ::= .*$", lambda _: _JSON_CHAR, grammar, flags=re.M)


def _converter(schema: dict[str, Any], prop_order: Sequence[str]) -> str:
    """llama-cpp-python's json_schema_to_gbnf, with enums written as a trie and string
    lengths as llama.cpp's own repetition `char{m,n}` (the converter nests n optional groups).

    The converter writes an enum as one alternative per value, and llama.cpp checks every
    candidate token against each alternative still open: 1,000 values cost ~2 s of one
    decode step on a 49k vocabulary. As a trie only the values' distinct next characters
    are open at once.
    """
    from llama_cpp.llama_grammar import PRIMITIVE_RULES, RESERVED_NAMES, SchemaConverter

    untyped: Any = SchemaConverter  # the library has no type hints

    class Converter(untyped):  # type: ignore[misc]
        def visit(self, schema: Any, name: str) -> Any:
            rule = name + "-" if name in RESERVED_NAMES else name or "root"
            if _plain_string_with_length(schema):
                char = self._add_primitive("char", PRIMITIVE_RULES["char"])
                low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
                span = f"{{{low},{'' if high is None else int(high)}}}"
                return self._add_rule(rule, f'"\\"" {char}{span} "\\"" space')
            # the converter's own precedence: these are read before an enum
            before = ("$ref", "oneOf", "anyOf", "const")
            plain = isinstance(schema, dict) and isinstance(schema.get("enum"), list)
            plain = plain and not any(k in schema for k in before)
            if not plain or isinstance(schema.get("type"), list):
                return super().visit(schema, name)
            literals = sorted({json.dumps(v) for v in schema["enum"]})
            if not literals:
                raise ValueError("enum must not be empty")
            return self._add_rule(rule, _trie(literals))

    order = {key: i for i, key in enumerate(prop_order)}
    converter = Converter(prop_order=order, allow_fetch=False, dotall=False, raw_pattern=False)
    converter.visit(converter.resolve_refs(json.loads(json.dumps(schema)), "stdin"), "")
    return str(converter.format_grammar())


def _plain_string_with_length(schema: Any) -> bool:
    """A string schema whose only constraint is its length."""
    if not isinstance(schema, dict) or schema.get("type") != "string":
        return False
    if "minLength" not in schema and "maxLength" not in schema:
        return False
    other = ("$ref", "oneOf", "anyOf", "allOf", "const", "enum", "pattern", "format")
    return not any(key in schema for key in other)


def _literal(text: str) -> str:
    """A GBNF string literal for JSON text (json.dumps writes no raw control characters)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _trie(words: list[str]) -> str:
    """GBNF matching exactly `words` (sorted, distinct), alternatives factored by prefix."""
    if len(words) == 1:
        return _literal(words[0])
    first, last = words[0], words[-1]  # sorted: their common prefix is everyone's
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    prefix = first[:n]
    if prefix:
        return f"{_literal(prefix)} {_trie([w[len(prefix) :] for w in words])}"
    ends = words[0] == ""  # sorted: the empty word comes first
    groups: dict[str, list[str]] = {}
    for w in words[ends:]:
        groups.setdefault(w[0], []).append(w)
    body = " | ".join(_trie(g) for g in groups.values())
    return f"({body})?" if ends else f"({body})"


_JSON_CHAR = (
    r'char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F]'
    r" [0-9a-fA-F] [0-9a-fA-F])"
)


def json_object_grammar() -> str:
    """Any JSON object (response_format json_object)."""
    return schema_grammar({"type": "object"})


def tool_call_grammar(
    tools: Sequence[ToolSpec],
    name: str | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    parallel: bool = False,
) -> str:
    """One call of one of the tools (or of `name`), arguments matching its schema; with
    `parallel`, one or more such calls, one after another on their own lines.

    SchemaTooLarge names the tool's index in `tools` in its path (`tools[i]...`)."""
    defs: dict[str, dict[str, Any]] = {"$defs": {}, "definitions": {}}
    calls = []
    budget = SchemaBudget(max_tokens)  # one grammar: the tools share it
    for i, t in enumerate(tools):
        if name is not None and t.name != name:
            continue
        params = bound_tool_parameters(i, json.loads(t.parameters), budget)
        if isinstance(params, dict):  # $refs point at the top: hoist each tool's $defs there
            for key, found in defs.items():
                found.update(params.pop(key, None) or {})
        calls.append(
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": params},
                "required": ["name", "arguments"],
            }
        )
    if not calls:
        raise ValueError(f"no tool named {name!r}")
    schema: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    schema = {**schema, **{key: found for key, found in defs.items() if found}}
    body = convert_schema(schema, ("name", "arguments"))
    body = re.sub(r"^root ::=", "tool-call ::=", body, flags=re.M)
    one = f'"{CALL_OPEN}\\n" tool-call "\\n{CALL_CLOSE}"'
    # A model that writes a newline after a call may still end there, not only call again.
    more = ' ("\\n" tagged-tool-call)* "\\n"?' if parallel else ""
    return f"{body}\ntagged-tool-call ::= {one}\nroot ::= tagged-tool-call{more}\n"


def bound_tool_parameters(index: int, params: Any, budget: SchemaBudget) -> dict[str, Any]:
    """A tool's parameters schema bounded for a grammar; SchemaTooLarge's path starts at
    `tools[index].function.parameters`."""
    try:
        return bound_schema(params, budget)
    except SchemaTooLarge as exc:
        raise SchemaTooLarge(
            exc.keyword,
            f"tools[{index}].function.parameters{'.' if exc.path else ''}{exc.path}",
            exc.reason,
        ) from None
