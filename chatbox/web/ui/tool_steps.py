"""An answer's tool calls as its bubble shows them: one collapsed block per call, with its
arguments and its result (and the passages a library search cited)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from markupsafe import Markup, escape

from chatbox.chat import Turn


def steps_from_turns(turns: Sequence[Turn]) -> list[dict[str, Any]]:
    """Tool turns (calls and results, in order) as steps, each call with its result."""
    return steps_from_data((t.role, data) for t in turns if (data := _loads(t.content)) is not None)


def steps_from_data(items: Iterable[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    for role, data in items:
        if role == "tool_call":
            steps.append({"call": data, "result": None})
        elif role in ("tool_result", "tool_approval", "tool_decision"):
            for step in reversed(steps):
                if step["call"].get("id") == data.get("id") and step["result"] is None:
                    if role == "tool_result":
                        step["result"] = data
                    else:  # waiting for the user's decision, until it is made
                        step["waiting"] = role == "tool_approval"
                    break
    return steps


def tools_before(turns: Sequence[Turn], index: int) -> list[Turn]:
    """The tool turns right before `turns[index]` (the answer that used them)."""
    start = index
    while start > 0 and turns[start - 1].role in ("tool_call", "tool_result"):
        start -= 1
    return list(turns[start:index])


def _loads(text: str) -> dict[str, Any] | None:
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _approval(conversation_id: str, call_id: str, name: str) -> Markup:
    """The buttons that allow or deny a call waiting for the user."""
    url = f"/ui/c/{conversation_id}/tool-calls/{call_id}"
    button = Markup(
        '<button type="button" class="btn btn-small{}" hx-post="{}" hx-vals=\'{{"allow": "{}"}}\''
        ' hx-target="closest .tool-approval" hx-swap="outerHTML">{}</button>'
    )
    return Markup(
        '<div class="tool-approval" data-testid="tool-approval" role="group"'
        ' aria-label="Allow this tool call?"><p class="small"><code>{}</code> may change things'
        " outside this chat. Allow this call?</p>{}{}</div>"
    ).format(
        name,
        button.format(" btn-primary", url, "1", "Allow once"),
        button.format("", url, "0", "Deny"),
    )


def steps_html(steps: Sequence[dict[str, Any]], conversation_id: str | None = None) -> Markup:
    """The blocks (empty when there are no steps); a call waiting for the user's decision
    opens with the buttons that decide it (given the conversation)."""
    if not steps:
        return Markup("")
    out = [Markup('<div class="tool-steps" data-testid="tool-steps">')]
    for step in steps:
        call, result = step["call"], step["result"]
        name = str(call.get("name", ""))
        waiting = result is None and step.get("waiting")
        state = "running…" if result is None else ("error" if result.get("is_error") else "done")
        if waiting:
            state = "waiting for you"
        if result is not None and result.get("cached"):
            state += ", cached"
        args = json.dumps(call.get("arguments", {}), ensure_ascii=False, indent=1)
        out.append(
            Markup(
                '<details class="tool-step" data-tool="{}"{}><summary>Tool: <code>{}</code>'
                ' <span class="muted small">({})</span></summary>'
                '<p class="small muted">Arguments</p><pre class="tool-args">{}</pre>'
            ).format(name, Markup(" open") if waiting else "", name, state, args)
        )
        if waiting and conversation_id:
            out.append(_approval(conversation_id, str(call.get("id", "")), name))
        if result is not None:
            out.append(
                Markup('<p class="small muted">Result</p><pre class="tool-result">{}</pre>').format(
                    result.get("text", "")
                )
            )
            cites = result.get("citations") or []
            if cites:
                items = Markup("").join(
                    Markup("<li>{}: {}</li>").format(c.get("title", ""), c.get("snippet", ""))
                    for c in cites
                )
                out.append(Markup('<ol class="tool-citations small">{}</ol>').format(items))
        out.append(Markup("</details>"))
    out.append(Markup("</div>"))
    return Markup("").join(out) if out else escape("")
