"""Render chat messages with the GGUF's tokenizer.chat_template (sandboxed Jinja)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from chatbox.engine.types import ChatMessage

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

GEMMA = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}"
    "{% set first_user_prefix = messages[0]['content'] + '\n\n' %}"
    "{% set loop_messages = messages[1:] %}"
    "{% else %}{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

# Known turn markers -> template, for GGUFs that ship without tokenizer.chat_template.
FALLBACKS = (("<start_of_turn>", GEMMA), ("<|im_start|>", CHATML))


def fallback_template(is_special_token: Callable[[str], bool]) -> str:
    """Pick a template by the turn-marker tokens the vocabulary has (ChatML otherwise)."""
    for marker, template in FALLBACKS:
        if is_special_token(marker):
            return template
    return CHATML


def _raise(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """A compiled chat template; falls back to ChatML when the model has none."""

    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = _strftime_now
        self.source = source or CHATML
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template = env.from_string(self.source)

    def render(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True) -> str:
        msgs: list[dict[str, Any]] = [{"role": m.role, "content": m.content} for m in messages]
        try:
            return self._template.render(
                messages=msgs,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except TemplateError:
            if any(m.role == "system" for m in messages):
                # Some templates reject a system role: fold it into the first user turn.
                return self.render(_fold_system(messages), add_generation_prompt)
            raise


def _fold_system(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    system = "\n\n".join(m.content for m in messages if m.role == "system")
    rest = [m for m in messages if m.role != "system"]
    if rest and rest[0].role == "user":
        rest[0] = ChatMessage("user", f"{system}\n\n{rest[0].content}")
    else:
        rest.insert(0, ChatMessage("user", system))
    return rest
