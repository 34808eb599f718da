"""``DeviceOp``: a lazy unit of device work whose output is the values it hands back.

How an op runs (its ``RunContext``, settle and finish, ``enqueue``) is in ``execution.py``.

Output convention: a ``KernelOp``'s output is the tuple of all its arguments; combinators
produce whatever they say (``map``: what ``f`` returns; ``zip``: a tuple of outputs). When an
output is handed to a callback it is spread as positional arguments if it is a tuple, else
passed as the one argument.
"""
from __future__ import annotations

import warnings
from asyncio.events import _get_running_loop as _running_loop

from ..errors import ArgumentError, BlockingSyncWarning, CopyError, ExecutionError, NotRunError
from ..tensor.hints import a_type_name, how_to_pass
from ..tensor.ownership import LOCK, NoCopies
from .execution import (RunContext, abandon_all, attach_recovered, enqueue, finish_fully,
                        finish_when_complete)


def fail_in_sequence(error: BaseException, outs, failed, rest) -> None:
    """``failed``, one of a sequence of ops run in order (``st.zip``, the ops of a
    ``graph.update``), raised ``error``. The ops ``rest`` after it will never run: hand back
    what they hold, and record on ``error`` every value the sequence took: ``outs`` (the
    outputs of the ops before it, handed back when their execution ends), what ``failed``
    handed back, and the values of ``rest``."""
    abandon_all([later for later in rest if isinstance(later, DeviceOp)])
    took = getattr(error, "recovered", None)
    if took is None and isinstance(failed, DeviceOp):
        took = failed._values()
    attach_recovered(error, tuple(outs) + (took,) + tuple(
        later._values() if isinstance(later, DeviceOp) else later for later in rest),
        replace=True)


class MissingName:
    """A name users of other libraries reach for that a class lacks: reading it raises an
    AttributeError with ``hint(obj, name)``, what to do instead."""

    # A class-level descriptor rather than ``__getattr__``: on Python 3.11 a class with
    # ``__getattr__`` loses the specialized lookup of every other attribute, and the launch
    # path reads an op's attributes many times per launch.
    __slots__ = ("name", "hint")

    def __init__(self, hint):
        self.hint = hint

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        raise AttributeError(f"{type(obj).__name__!r} object has no attribute {self.name!r}: "
                             f"{self.hint}", name=self.name, obj=obj)


# What futures, JAX and Triton users reach for on an op: where its output is.
NO_OUTPUT_YET = ("an op is lazy and its output exists once it has run. Run it and take the "
                 "output from op.sync() (a kernel's output is every argument, in order: `x, y, "
                 "z = op.sync()`), or `x, y, z = await op` in a coroutine; st.submit(op) gives "
                 "an asyncio.Future of it")
# What an op's users reach for on a graph: how to replay it.
REPLAYED_BY = ("a graph is replayed by g.launch(), an op: g.launch().sync(), or `await "
               "g.launch()` in a coroutine")


def unrun_argument(op, callee: str | None = None) -> str:
    """How to name ``op`` where its output was expected (by ``callee``), and what to pass."""
    chain = (f"op.then({callee}) (its output values become {callee}'s arguments) or "
             f"op.then(lambda *values: {callee}(...))" if callee else
             "op.then(lambda *values: ...) (it receives the output values)")
    return (f"an op that has not run ({a_type_name(op)}), not its output; pass its output "
            f"instead: run it first and pass what op.sync() returns (a kernel's output is every "
            f"argument, in order: `x, y, z = op.sync()`), or chain the call after it with {chain}")


def given_argument(v, want: str, callee: str | None = None) -> str:
    """``v`` named as what was given where ``want`` (``"input"``, ``"output"``, ``"tensor"``)
    was expected (by ``callee``), with what to pass instead."""
    if isinstance(v, DeviceOp):
        return unrun_argument(v, callee)
    hint = how_to_pass(v, want)
    return f"{a_type_name(v)}{f'; {hint}' if hint else ''}"


def _end_of(values: tuple, i: int, which: str):
    if not values:
        raise ArgumentError(f"op.{which}() of an op whose output is empty: there is no "
                            f"{which} value")
    return values[i]


# ``_consumed`` of an op that will never run: an execution it was part of failed first and
# handed its values back (truthy, as is the True of an op that ran).
ABANDONED = "abandoned"


class DeviceOp(NoCopies):
    """Lazy device work. ``sync()`` runs it and returns its output; ``await op`` too."""

    _consumed = False

    # -- no copies: an op runs once and hands its values back once -------------------------
    def _refuse_copy(self, how: str):
        raise CopyError(f"{self!r} cannot be {how}: an operation runs once and hands its "
                        f"values back once. Build the operation again (call the kernel "
                        f"again), share one run with op.shared(), or replay it with "
                        f"op.graph()")

    # -- a lazy op is not its values: `x, y, z = add(...)` forgot to run it -----------------
    def _not_run(self, how: str):
        raise NotRunError(f"{self!r} cannot be {how}: a launch only builds a lazy op, and its "
                          f"values exist once it has run; run it first: `x, y, z = "
                          f"op.sync()`, or `x, y, z = await op` in a coroutine")

    def __iter__(self):
        self._not_run("unpacked or iterated")

    def __getitem__(self, key):
        self._not_run("indexed")

    # One descriptor per name (each learns its name from __set_name__).
    result, wait, run, get, value, output, block_until_ready = (
        MissingName(NO_OUTPUT_YET) for _ in range(7))

    # -- to be provided by subclasses ------------------------------------------------------
    def _run(self, ctx: RunContext):
        """Enqueue the work on ``ctx.stream`` and return the output."""
        raise NotImplementedError

    def _abandon(self) -> None:
        """This op will never run (an earlier part of an execution failed): hand back what it
        holds, so that no argument is lost. Does nothing for an op that already ran."""

    def _values(self):
        """What this op holds, in the shape of its output as far as it is known before it
        runs (an error's ``recovered`` names these for ops that never ran)."""
        return None

    def _host_bound(self) -> bool:
        """True when the work (as far as known before running) runs on the CPU executor,
        so that ``await`` must run it off the event-loop thread."""
        return True

    def _claim(self, how=True) -> bool:
        """Mark this op consumed (``how``: True to run it, ``ABANDONED``); False if it already
        was. Atomic: two threads syncing one op must not both run it on its one borrow."""
        with LOCK:
            if self._consumed:
                return False
            self._consumed = how
            return True

    def _take(self) -> None:
        """Mark this op as executed; an op runs once (its arguments come back once)."""
        if not self._claim():
            if self._consumed is ABANDONED:
                raise ExecutionError(f"{self!r} never ran: it was given up when an op or "
                                     f"execution it was part of was refused or failed, and "
                                     f"its values were handed back (that error's "
                                     f"e.recovered); build the op again to run it")
            raise ExecutionError(f"{self!r} has already run (or is running): an op runs once. "
                                 f"Build it again to run it again, or capture one with "
                                 f"op.graph() and replay that to run work repeatedly")

    # -- combinators ----------------------------------------------------------------------
    def then(self, f) -> "DeviceOp":
        """The op ``f(*outputs)`` returns, run after this one on the same stream.

        This op's values are handed back before ``f`` is called, so ``f`` may pass them on to
        the next launch. ``f`` must return a ``DeviceOp`` and must not start execution; an
        ``async def`` ``f`` is refused (``ExecutionError``), as nothing could await it. An
        error ``f`` raises recovers the values ``f`` was given, or ``(given, account)`` where
        a launch inside ``f`` attached its own account."""
        return _combinators.ThenOp(self, f)

    def map(self, f) -> "DeviceOp":
        """An op whose output is ``f(*outputs)`` (a host-side transform, never ``async``)."""
        return _combinators.MapOp(self, f)

    def first(self) -> "DeviceOp":
        """An op whose output is the first of this op's output values."""
        return self.map(lambda *values: _end_of(values, 0, "first"))

    def last(self) -> "DeviceOp":
        """An op whose output is the last of this op's output values."""
        return self.map(lambda *values: _end_of(values, -1, "last"))

    def shared(self) -> "DeviceOp":
        """A handle that runs this op at most once, however many consumers run it."""
        return _combinators.SharedOp(self)

    # -- execution ------------------------------------------------------------------------
    def sync(self, stream=None):
        """Run, block until the work is done, and return the output (every value handed back).

        ``stream``: a ``torch.cuda.Stream`` to run on; default: torch's current stream.
        Called on a thread that runs an asyncio event loop it blocks that loop, and warns
        (``st.BlockingSyncWarning``): in a coroutine, ``await op`` instead."""
        if _running_loop() is not None:
            warnings.warn("op.sync() blocks the running asyncio event loop until the device "
                          "work is done; in a coroutine use `await op`, which waits without "
                          "blocking it", BlockingSyncWarning, stacklevel=2)
        ctx, out = enqueue(self, stream, "op.sync()")
        try:
            # The values come back while the device works, as before a `then` callback: the
            # work is ordered before any later launch on this stream, and its borrows, which
            # every other use meets, end only once it is complete (ctx.finish, below).
            ctx.settle()
            if ctx.stream is not None:
                ctx.stream.synchronize()
        except BaseException as e:                # e.g. KeyboardInterrupt before the wait
            attach_recovered(e, out)
            while True:                           # never end borrows of running work; again
                try:                              # if interrupted as it is entered
                    finish_when_complete(ctx)
                    break
                except KeyboardInterrupt:
                    continue
                except BaseException:             # (e is the one to report)
                    break
            raise
        try:
            ctx.finish()
        except BaseException as e:
            attach_recovered(e, out)
            while not isinstance(e, Exception):   # an interrupt may have cut it short
                try:
                    finish_fully(ctx)
                    break
                except KeyboardInterrupt:
                    continue
                except BaseException:             # (e is the one to report)
                    break
            raise
        return out

    def __await__(self):
        """``await op``: run it without blocking the event loop; the output once complete."""
        # Submit now (``await`` iterates at once) and wait on the op's asyncio future: no
        # coroutine or Task of our own per awaited op. A cancelled await raises only once
        # the work has completed, with the output as ``e.recovered`` (aio.py).
        return _aio.await_op(self)

    def graph(self):
        """Record this op into a graph (a CUDA graph on the GPU) and return the ``Graph``.

        Nothing runs now: ``g.launch()`` replays the recorded launches; ``g.output`` is the
        output values (valid after a replay has been synchronized)."""
        return _graph.record_graph(self)


from . import aio as _aio, combinators as _combinators, graph as _graph  # noqa: E402 (cycle)
