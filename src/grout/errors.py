"""grout's typed errors: every failure a user can cause is one of these (all ValueErrors)."""

import contextlib
import sys
import traceback


class GroutError(ValueError):
    """Base class of grout's errors."""


class CheckpointError(GroutError):
    """A checkpoint cannot be used: a missing file, a truncated or corrupt safetensors file,
    a tensor missing or of the wrong shape, an unsupported architecture. The message names
    the file (and the tensor)."""


class RequestError(GroutError):
    """A request cannot be served as given: a prompt longer than the cache, token ids outside
    the vocabulary, bad sampling parameters, an unknown model name or device."""


class ShardingError(GroutError):
    """A model cannot be split over the requested number of ranks (tensor parallelism): a
    head count, the MLP width or the vocabulary that the rank count does not divide."""


def check_flag(name: str, value) -> None:
    """RequestError unless ``value`` is True or False: a string such as "false" or "no" would
    read as true."""
    if not isinstance(value, bool):
        raise RequestError(f"{name} must be True or False, got {value!r:.60}")


def drop_locals(error: BaseException, handled: BaseException | None = None) -> None:
    """Clear the local variables of every finished frame ``error`` (and the errors it
    chains) passed through, up to ``handled``: the error the caller was handling when the
    failing call began (``sys.exc_info()[1]`` then), whose frames are the caller's own.

    A traceback keeps each frame it passed through alive, and each frame its locals, for as
    long as the error is kept (``sys.last_value`` in a REPL, an ``except ... as`` in a
    caller): a failure while building something large (the weights) would keep it
    allocated. The frames still running, the caller's, keep theirs; the printed traceback is
    unchanged."""
    pending, seen = [error], {id(handled)}
    while pending:
        e = pending.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        pending += [e.__cause__, e.__context__]


@contextlib.contextmanager
def dropping_locals():
    """A block whose failure (an interrupt too) leaves :func:`drop_locals` done on its error."""
    # A generation interrupted (Ctrl-C) between building a launch and running it leaves the
    # launch, which borrows the engine's buffers, in a frame of the traceback that a REPL
    # keeps: every later request would meet that borrow until the error is dropped.
    handled = sys.exc_info()[1]
    try:
        yield
    except BaseException as e:
        drop_locals(e, handled)
        raise
