"""What a request gives back: a :class:`Completion`, or a :class:`Stream` of :class:`Piece`."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Iterator

from .logprobs import TokenLogprobs


@dataclass
class Completion:
    """A finished generation: ``finish_reason`` is "stop" (an eos token or a stop string)
    or "length" (``max_new_tokens``, or the context full: :func:`token_budget`)."""

    text: str
    token_ids: list
    finish_reason: str
    prompt_tokens: int
    logprobs: list | None = None     # with generate(..., logprobs=k): a TokenLogprobs a token

    @property
    def completion_tokens(self) -> int:
        """How many tokens were generated (``len(token_ids)``)."""
        return len(self.token_ids)


@dataclass
class Piece:
    """One generated token and the text it completes (possibly empty: text is held back
    while it may still turn into a stop string or an incomplete character). The last piece
    of a stream carries the ``finish_reason``."""

    text: str
    token_id: int
    finish_reason: str | None = None
    logprobs: TokenLogprobs | None = None      # with stream(..., logprobs=k)
    offset: int = 0                            # where this token's text starts in the output


class Stream:
    """The generator :meth:`Engine.stream` returns: iterate it for :class:`Piece` values;
    ``close()`` stops generation, also from another thread. ``prompt_tokens``: the prompt's
    length in tokens; ``decoded``: the tokens the engine has produced so far, those decoded
    ahead in a chunk of graph replays and not yet yielded included."""

    def __init__(self, prompt_tokens: int):
        self._gen: Iterator[Piece] = iter(())
        self.prompt_tokens = prompt_tokens
        self.decoded = 0
        self._closed = False
        # Held while a piece is made: a generator running on one thread cannot be closed
        # from another, so such a close only marks the stream, and the next piece is none.
        self._stepping = threading.Lock()

    def __iter__(self):
        """The stream itself: iterate it for the pieces."""
        return self

    def __next__(self) -> Piece:
        """The next piece (StopIteration once the generation has finished or is closed)."""
        with self._stepping:
            if self._closed:
                self._gen.close()
                raise StopIteration
            return next(self._gen)

    def close(self) -> None:
        """Stop generating (the engine is free for the next request). From another thread
        while a piece is being made, generation stops once that piece is out."""
        self._closed = True
        if self._stepping.acquire(blocking=False):
            try:
                self._gen.close()
            finally:
                self._stepping.release()

    def __enter__(self):
        """``with eng.stream(...) as s``: the stream, closed when the block ends."""
        return self

    def __exit__(self, *exc):
        """Close the stream (its generation stops; the engine is free for the next)."""
        self.close()
