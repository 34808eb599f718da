"""Stop strings: checking a request's, and how much of a growing text to hold back.

Generated text that may still turn into a stop string is held back (never sent, then taken
back): the held-back part is the longest end of the text that is a proper prefix of some
stop string. Recomputing it from scratch after every token would compare every end of the
text against every prefix of every stop, quadratic in a stop's length; :class:`StopTail`
instead keeps, for each stop string, the length of the longest prefix of it the text ends
with, and updates it as text is appended (Knuth-Morris-Pratt matching): the work is linear
in the text generated plus the stops' total length.
"""
from __future__ import annotations

from .errors import RequestError
from .tokenizer import check_unicode


def stop_strings(stop) -> tuple:
    """A request's ``stop`` (None, a string or a list of strings) as a tuple of strings."""
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError(f"stop must be a non-empty string or a list of them, got "
                           f"{stop!r:.80}")
    for s in stops:
        check_unicode(s)          # a lone surrogate has no UTF-8: it could never match
    return tuple(stops)


def _borders(s: str) -> list:
    """``borders[k - 1]``: the length of the longest proper prefix of ``s[:k]`` that is also
    a suffix of it (KMP's failure function)."""
    borders, k = [0] * len(s), 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = borders[k - 1]
        if s[i] == s[k]:
            k += 1
        borders[i] = k
    return borders


class StopTail:
    """How many characters at the end of a growing text could begin a stop string.

    Feed it the text as it grows (:meth:`feed`); :attr:`held` is then the length of the
    longest end of the text that is a proper prefix of one of the stops (0: none is). A
    stop string that the text contains whole does not count itself (finding those is
    ``str.find``'s job); the ends of it that begin it again do."""

    def __init__(self, stops):
        self._stops = tuple(s for s in stops if s)     # "" begins nothing it could hold back
        self._borders = [_borders(s) for s in self._stops]
        self._matched = [0] * len(self._stops)    # per stop: the prefix the text ends with
        self.held = 0

    def feed(self, text: str) -> int:
        """Append ``text`` to the text seen so far; returns :attr:`held`."""
        if not text:
            return self.held
        for j, stop in enumerate(self._stops):
            k, borders = self._matched[j], self._borders[j]
            for c in text:
                while k and stop[k] != c:
                    k = borders[k - 1]
                if stop[k] == c:
                    k += 1
                if k == len(stop):                # the whole stop: keep what may restart it
                    k = borders[k - 1]
            self._matched[j] = k
        self.held = max(self._matched, default=0)
        return self.held


def held_back(text: str, stops) -> int:
    """Characters at the end of ``text`` that could begin a stop string (the longest end of
    it that is a proper prefix of one)."""
    return StopTail(stops).feed(text)
