"""How long a schema's pattern can match, read conservatively from the regular expression."""

from __future__ import annotations

import math

from chatbox.engine.pattern_span import Span, pattern_span


def test_fixed_classes_escapes_and_counted_repeats() -> None:
    assert pattern_span(r"^[0-9]{3}-\d{4}$") == Span(8, 8)


def test_alternatives_take_the_shortest_and_the_longest_branch() -> None:
    assert pattern_span("^(ab|c)d?$") == Span(1, 3)


def test_an_unbounded_repeat_counts_its_minimum_and_one_more() -> None:
    span = pattern_span("^a+b*$")
    assert span == Span(1, 3) and not math.isinf(span.longest)


def test_a_pattern_it_cannot_read_spans_nothing() -> None:
    assert pattern_span("^(ab$") == Span(0, 0)
    assert pattern_span("*a") == Span(0, 0)
