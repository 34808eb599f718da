"""StopStringMatcher: stop strings found across pieces, partial matches held, nothing retracted."""
from hypothesis import given, settings
from hypothesis import strategies as st

from grout.stop_strings import StopStringMatcher


def feed_all(stop, pieces):
    m = StopStringMatcher(stop)
    released = [m.feed(p) for p in pieces]
    if m.matched is None:
        released.append(m.flush())
    return m, released


def reference_cut(stop, pieces):
    """What a generation returns: it ends at the first piece after which the text holds a
    stop string, and keeps the text before that string's earliest occurrence."""
    text = ""
    for piece in pieces:
        text += piece
        cuts = [text.find(s) for s in stop if s in text]
        if cuts:
            return text[: min(cuts)]
    return text


def test_text_without_stop_strings_passes_through_at_once():
    m = StopStringMatcher([])
    assert m.feed("Hello") == "Hello" and m.feed(", world") == ", world"


def test_stop_string_inside_one_piece_cuts_before_it():
    m, released = feed_all(["END"], ["abcENDxyz"])
    assert released == ["abc"] and m.matched == "END"


def test_stop_string_spanning_pieces_is_held_back_and_dropped():
    m = StopStringMatcher(["</s>"])
    assert m.feed("hi <") == "hi "
    assert m.held == "<"
    assert m.feed("/") == ""
    assert m.feed("s> more") == ""
    assert m.matched == "</s>"


def test_partial_match_that_fails_is_released_whole():
    m = StopStringMatcher(["</s>"])
    assert m.feed("a </") == "a "
    assert m.feed("b") == "</b"
    assert m.held == ""


def test_held_text_is_flushed_when_generation_ends():
    m = StopStringMatcher(["STOP"])
    assert m.feed("xST") == "x"
    assert m.flush() == "ST"


def test_earliest_of_several_stop_strings_wins():
    m, released = feed_all(["world", "lo"], ["hello world"])
    assert "".join(released) == "hel" and m.matched == "lo"


def test_nothing_is_released_after_a_match():
    m = StopStringMatcher(["x"])
    m.feed("axb")
    assert m.feed("more") == "" and m.flush() == ""


def test_empty_stop_strings_are_ignored():
    assert StopStringMatcher(["", "z"]).stop == ("z",)


@settings(max_examples=150, deadline=None)
@given(stop=st.lists(st.text("ab<>", min_size=1, max_size=4), min_size=1, max_size=3),
       pieces=st.lists(st.text("ab<>", max_size=4), max_size=12))
def test_released_text_is_always_the_prefix_before_the_first_stop_string(stop, pieces):
    m, released = feed_all(stop, pieces)
    assert "".join(released) == reference_cut(stop, pieces)
    assert (m.matched is not None) == any(s in "".join(pieces) for s in stop)


@settings(max_examples=150, deadline=None)
@given(stop=st.lists(st.text("ab<>", min_size=1, max_size=4), min_size=1, max_size=3),
       pieces=st.lists(st.text("ab<>", max_size=4), max_size=12))
def test_only_a_possible_start_of_a_stop_string_is_held(stop, pieces):
    m = StopStringMatcher(stop)
    text = sent = ""
    for piece in pieces:
        sent += m.feed(piece)
        text += piece
        if m.matched is not None:
            break
        assert sent + m.held == text
        assert m.held == "" or any(s.startswith(m.held) and s != m.held for s in stop)
