from __future__ import annotations

from chatbox.engine.chat_template import TRANSCRIPT, TRANSCRIPT_STOPS, ChatTemplate
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


def test_base_model_transcript_continues_where_the_answer_was_cut() -> None:
    """A base model gets a plain transcript: each rendered turn extends the previous prompt
    plus the answer, so the next turn reuses the cached prefix."""
    t = ChatTemplate(TRANSCRIPT, "<bos>", stops=TRANSCRIPT_STOPS)
    first = (ChatMessage("system", "Be brief."), ChatMessage("user", "Capital of France?"))
    prompt = t.render(first)
    assert prompt.startswith("<bos>The following is a conversation") and "Be brief." in prompt
    assert prompt.endswith("\n\nUser: Capital of France?\nAssistant:")
    answer = "Paris."  # as streamed: leading space dropped, cut at the "\n\nUser:" stop
    second = t.render((*first, ChatMessage("assistant", answer), ChatMessage("user", "And Italy?")))
    assert second.startswith(prompt + " " + answer)
    assert second.endswith("Paris.\n\nUser: And Italy?\nAssistant:")
    assert "\n\nUser:" in t.stops and "\n\nUser:" in second[len(prompt) :]
