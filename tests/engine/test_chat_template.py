from __future__ import annotations

from chatbox.engine.chat_template import ChatTemplate
from chatbox.engine.types import ChatMessage


def test_chatml_fallback_renders_generation_prompt() -> None:
    t = ChatTemplate(None)
    text = t.render((ChatMessage("system", "S"), ChatMessage("user", "hi")))
    expected = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    assert text == expected + "<|im_start|>assistant\n"


def test_template_rejecting_system_role_gets_it_folded_into_first_user_turn() -> None:
    src = (
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('no system role') }}{% endif %}"
        "[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    )
    text = ChatTemplate(src).render((ChatMessage("system", "S"), ChatMessage("user", "hi")))
    assert text == "[user]S\n\nhi"


def test_bos_token_variable() -> None:
    t = ChatTemplate("{{ bos_token }}{{ messages[0]['content'] }}", bos_token="<s>")
    assert t.render((ChatMessage("user", "x"),)) == "<s>x"
