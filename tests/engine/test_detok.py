"""UTF-8-safe incremental detokenizing and stop strings (no model needed)."""

from __future__ import annotations

from chatbox.engine.detok import StopTextStream


def feed_all(stream: StopTextStream, pieces: list[bytes]) -> list[str]:
    out = [stream.feed(p) for p in pieces]
    out.append(stream.finish())
    return [o for o in out if o]


def test_emoji_split_across_pieces_arrives_whole() -> None:
    data = "a😀b日本".encode()
    pieces = [data[i : i + 1] for i in range(len(data))]
    out = feed_all(StopTextStream(), pieces)
    assert "".join(out) == "a😀b日本"
    assert "😀" in out and "\ufffd" not in "".join(out)


def test_invalid_bytes_become_replacement_not_stall() -> None:
    out = feed_all(StopTextStream(), [b"a", b"\xff", b"b"])
    assert "".join(out) == "a\ufffdb"


def test_an_answer_cut_inside_a_character_ends_before_it() -> None:
    """max_tokens can end an answer with the first bytes of a character: they are dropped,
    not sent as U+FFFD."""
    data = "ok 日本".encode()
    out = feed_all(StopTextStream(), [data[:4], data[4:7], data[7:8]])
    assert "".join(out) == "ok 日"
    s = StopTextStream(stops=("END",))
    assert "".join(feed_all(s, [b"xE", "😀".encode()[:3]])) == "xE"


def test_stop_string_spanning_pieces_is_cut_and_not_emitted() -> None:
    s = StopTextStream(stops=("END",))
    out = feed_all(s, [b"hello E", b"N", b"D more"])
    assert "".join(out) == "hello "
    assert s.stopped


def test_partial_stop_prefix_is_released_when_it_diverges() -> None:
    s = StopTextStream(stops=("END",))
    assert s.feed(b"xE") == "x"
    assert s.feed(b"N") == ""
    assert s.feed(b"x") == "ENx"
    assert not s.stopped


def test_held_prefix_flushes_at_finish() -> None:
    s = StopTextStream(stops=("END",))
    assert s.feed(b"abcEN") == "abc"
    assert s.finish() == "EN"


def test_earliest_of_several_stops_wins() -> None:
    s = StopTextStream(stops=("world", "lo w"))
    assert "".join(feed_all(s, [b"hello world"])) == "hel"


def test_stop_inside_multibyte_text() -> None:
    s = StopTextStream(stops=("本",))
    data = "日本語".encode()
    out = feed_all(s, [data[i : i + 1] for i in range(len(data))])
    assert "".join(out) == "日"


def test_transcript_answer_loses_its_leading_space_and_the_next_user_line() -> None:
    s = StopTextStream(stops=("\n\nUser:", "\nUser:"), lstrip=True)
    out = feed_all(
        s, [b" ", b" The", b" capital", b" is", b" Paris", b".\n", b"\n", b"User", b":", b" thanks"]
    )
    assert "".join(out) == "The capital is Paris." and s.stopped
    assert out[0] == "The"  # nothing empty or blank streamed first
    inner = StopTextStream(lstrip=True)
    assert "".join(feed_all(inner, [b"a", b" b", b"  c"])) == "a b  c"  # only the start
