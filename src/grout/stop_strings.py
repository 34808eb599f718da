"""Stop strings over streamed text: hold back what might become a stop string, never retract.

Text arrives piece by piece (one decoded token at a time). A stop string may span pieces, so
the tail of the text that is a proper prefix of some stop string is held back until the next
piece decides it: either the stop string completes (generation ends and the held text is
dropped) or it cannot (the held text is released). Text once released is never taken back,
which is what a streaming client needs.
"""
from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    """Feeds text pieces; releases the text that is certainly before any stop string."""

    def __init__(self, stop: Sequence[str]) -> None:
        self.stop = tuple(s for s in stop if s)
        self._held = ""
        self.matched: str | None = None

    @property
    def held(self) -> str:
        """Text received but not yet released (a possible start of a stop string)."""
        return self._held

    def feed(self, piece: str) -> str:
        """Take the next piece of text and return the part now safe to release.

        After a stop string is found, ``matched`` names it, the text before it is returned,
        and everything after it (and any later piece) is dropped.
        """
        if self.matched is not None:
            return ""
        text = self._held + piece
        if not self.stop:
            self._held = ""
            return text
        first = None
        for s in self.stop:
            at = text.find(s)
            if at >= 0 and (first is None or at < first[0]):
                first = (at, s)
        if first is not None:
            self.matched = first[1]
            self._held = ""
            return text[: first[0]]
        keep = self._longest_partial_match(text)
        self._held = text[len(text) - keep:] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """Release whatever is held (generation ended without completing a stop string)."""
        if self.matched is not None:
            return ""
        text, self._held = self._held, ""
        return text

    def _longest_partial_match(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best
