"""Retrieved context goes before the user's message, leaving earlier messages untouched."""

from __future__ import annotations

from chatbox.chat.context import TurnContext, with_context


def test_no_context_leaves_the_message_as_it_is() -> None:
    assert with_context("What is 2+2?", TurnContext()) == "What is 2+2?"
    assert with_context("hi", TurnContext(text="", tokens=3)) == "hi"


def test_context_comes_first_set_off_by_a_rule() -> None:
    context = TurnContext(text="[1] The spare key is under the mat.", tokens=9)
    assert with_context("Where is the key?", context) == (
        "[1] The spare key is under the mat.\n\n---\n\nWhere is the key?"
    )
