"""A turn's place among its sibling branches (the "< 2/3 >" switcher)."""

from __future__ import annotations

from chatbox.chat.views import TurnView
from chatbox.store import Turn


def turn(turn_id: str) -> Turn:
    return Turn(turn_id, 1, "c1", "t0", "assistant", "text", "complete", "tiny", 1, 1, 0, None, 0.0)


def test_an_only_child_has_no_siblings_to_switch_to() -> None:
    view = TurnView(turn("a"), ["a"])
    assert (view.sibling_index, view.sibling_count) == (0, 1)
    assert view.prev_sibling is None and view.next_sibling is None


def test_a_middle_sibling_links_both_ways() -> None:
    view = TurnView(turn("b"), ["a", "b", "c"])
    assert (view.sibling_index, view.sibling_count) == (1, 3)
    assert (view.prev_sibling, view.next_sibling) == ("a", "c")


def test_the_first_and_last_siblings_link_one_way() -> None:
    first, last = TurnView(turn("a"), ["a", "b", "c"]), TurnView(turn("c"), ["a", "b", "c"])
    assert (first.prev_sibling, first.next_sibling) == (None, "b")
    assert (last.prev_sibling, last.next_sibling) == ("b", None)
