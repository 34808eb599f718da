"""Stop strings: what the engine holds back of a growing text, because it may still become a
stop string, is the longest end of the text that is a proper prefix of one of them."""
import random

import pytest

from grout.stops import StopTail, held_back, stop_strings


def held_back_by_definition(text, stops):
    """The longest k < len(stop) such that ``text`` ends with ``stop[:k]``, over the stops."""
    return max((k for s in stops for k in range(1, min(len(s) - 1, len(text)) + 1)
                if text.endswith(s[:k])), default=0)


@pytest.mark.parametrize("text, stops, held", [
    ("Hello wor", ("world",), 3),
    ("Hello", ("world",), 0),
    ("abab", ("abac",), 2),                    # the end "ab" begins the stop, "bab" not
    ("xaa", ("aab",), 2),                      # "aa", not only the last "a"
    ("the end", ("END", "end."), 3),           # case matters; the longest over the stops
    ("", ("stop",), 0),
    ("abc", (), 0),
])
def test_held_back_is_the_longest_end_of_the_text_that_begins_a_stop(text, stops, held):
    assert held_back(text, stops) == held


def test_a_whole_stop_string_holds_back_only_what_may_begin_it_again():
    assert held_back("xxabab", ("abab",)) == 2          # "ab" may begin "abab" again
    assert held_back("xxabc", ("abc",)) == 0


def test_held_back_agrees_with_its_definition_on_random_texts():
    rng = random.Random(0)
    for _ in range(3000):
        alphabet = rng.choice(["a", "ab", "abc"])
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
        stops = tuple("".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 7)))
                      for _ in range(rng.randrange(4)))
        assert held_back(text, stops) == held_back_by_definition(text, stops), (text, stops)


def test_feeding_text_in_pieces_holds_back_what_the_whole_text_would():
    rng = random.Random(1)
    stops = ("abcab", "bcc", "cccc")
    text = "".join(rng.choice("abc") for _ in range(400))
    tail, fed = StopTail(stops), 0
    while fed < len(text):
        piece = text[fed:fed + rng.randrange(4)]
        fed += len(piece)
        assert tail.feed(piece) == held_back_by_definition(text[:fed], stops)


@pytest.mark.parametrize("stop", [[""], ["a", 3], 5, [None]])
def test_a_stop_that_is_not_non_empty_strings_is_a_request_error(stop):
    import grout
    with pytest.raises(grout.RequestError, match="stop must be a non-empty string"):
        stop_strings(stop)


def test_an_empty_stop_holds_nothing_back():
    assert held_back("abc", ["", "cd"]) == 1
