"""The execution state of ``DeviceOp``s: the ``RunContext`` an op runs in, and ``enqueue``.

An op runs inside a ``RunContext`` (a stream and what is still owed). ``_run`` enqueues the
work and returns the op's output. Two things are owed back, at two different times:

- *settle*: the argument handles become usable again. This happens once the work is ordered
  before any later use: before a ``then``/``map`` callback (the next op runs on the same
  stream, after this one), before ``sync`` waits (the caller gets the values only after the
  wait) and when the execution finishes.
- *finish*: the storage borrows end. This happens only when the work is complete: after the
  stream is synchronized (``sync``), or when the CUDA event of an ``await`` has fired. Until
  then every other launch, thread or host read still meets the borrows (``AliasError`` /
  ``BorrowError``), while ops of the same execution, ordered on its stream, do not.

Execution is not re-entrant on a thread: while an execution is running (a ``sync``, the
submission of an ``await``, a graph record or replay), starting another one from inside it,
typically from a ``then`` or ``map`` callback, raises ``ExecutionError``.

This module knows ops only by their methods (``_run``, ``_abandon``, ``_values``), so that
``op.py`` can import it and nothing here imports ``op.py``.
"""
from __future__ import annotations

import contextlib
import threading

from ..errors import ExecutionError, GraphCaptureError
from ..tensor import borrows
from ..tensor.alloc import FORBIDDING, allocation_forbidden
from . import streams

_state = threading.local()
# The active graph scopes' allocation guards of this context (an empty tuple outside any):
# read on every execution, so bound once.
_guarded = FORBIDDING.var.get


def spread(out) -> tuple:
    """An output as positional arguments for a callback."""
    return out if type(out) is tuple else (out,)


class _Unknown:
    """``RunContext.last`` when work safetile did not launch may precede the next launch on
    the stream (an execution's start; torch work a ``then``/``map`` callback may enqueue)."""

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()


class RunContext:
    """Where and how one execution runs.

    ``stream``: the torch CUDA stream (None on a machine without CUDA); ``handle``: its raw
    ``cudaStream_t`` as an int, what the launcher passes (0 without CUDA); ``recording``: a
    list while a graph records (ops append their launches instead of executing them);
    ``turn``: a graph scope's record holds its scope's turn (or None), which its ``then`` /
    ``map`` callbacks give up while they run (``turn.run(f, args)``).
    """

    __slots__ = ("stream", "handle", "recording", "last", "turn", "_settle", "_finish",
                 "_held", "_first")

    def __init__(self, stream=None, recording=None):
        self.stream = stream
        self.handle = stream.cuda_stream if stream is not None else 0
        self.recording = recording
        self.last = UNKNOWN                       # the last KernelOp launched on the stream
        self.turn = None
        self._settle: list = []
        self._finish: list = []
        self._held = None                         # (device, lo, hi) of dense extents -> write
        self._first = None                        # the first op's extents, not yet in _held

    def keeps(self, extents) -> bool:
        """Whether this execution already borrows, until it finishes, every byte of
        ``extents`` at least as strongly (a write for a write). Then an op's own borrow of them
        adds nothing, and dropping it keeps a long ``then`` chain on the same buffers from
        piling up borrows that every later launch would walk. Otherwise the extents are noted
        as borrowed (the caller keeps the op's borrow until the execution finishes)."""
        held = self._held
        if held is None:
            if self._first is None:               # nothing borrowed yet: most executions
                self._first = extents             # are one op, so index it only if needed
                return False
            held = self._held = {}
            self._note(held, self._first)
        if all(e.dense and (e.device, e.lo, e.hi) in held and
               held[(e.device, e.lo, e.hi)] >= e.write for e in extents):
            return True
        self._note(held, extents)
        return False

    @staticmethod
    def _note(held: dict, extents) -> None:
        for e in extents:
            if e.dense:
                key = (e.device, e.lo, e.hi)
                held[key] = held.get(key, False) or e.write

    def defer(self, fn) -> None:
        """Run ``fn`` when the work enqueued so far is ordered before host use."""
        self._settle.append(fn)

    def finish(self) -> None:
        """The work is complete: end every borrow, then hand every value back."""
        self.last = UNKNOWN                       # (no cycle keeps the last op's values alive)
        error = _run_each(self._finish)
        try:
            self.settle()
        finally:
            if error is not None:
                raise error

    def settle(self) -> None:
        """Run every deferred release in order (and those deferred meanwhile), all of them
        even if one raises; the first failure is raised (see ``_run_each``)."""
        error = _run_each(self._settle)
        if error is not None:
            raise error


def _run_each(pending: list):
    """Call every function of ``pending`` in order (and those added meanwhile), all of them
    even if one raises, and return the first failure (or None). One cut short by an
    interrupt (a ``KeyboardInterrupt``) runs again, as the values it hands back come back
    nowhere else (releases are idempotent); each stays listed until it has run, so an
    interrupt that escapes (landing between two of them) leaves the rest to a later call."""
    error, i = None, 0
    while True:
        try:
            while i < len(pending):
                pending[i]()
                i += 1
            break
        except Exception as e:                    # keep releasing; report the first failure
            error = error or e
            i += 1
        except BaseException as e:
            error = error or e
    del pending[:i]
    return error


@contextlib.contextmanager
def executing(what: str):
    """Mark this thread as executing; raise if it already is (execution is not re-entrant)."""
    if getattr(_state, "busy", None) is not None:
        inside = _state.busy
        raise ExecutionError(
            f"cannot start execution ({what}) inside a running {inside}; return the next op "
            f"from a `then` callback instead of running it there")
    _state.busy = "execution"
    try:
        yield
    finally:
        _state.busy = None


@contextlib.contextmanager
def in_callback(kind: str):
    """Mark a user callback (``then`` / ``map``) as running, for the re-entrancy message."""
    outer = getattr(_state, "busy", None)
    _state.busy = f"`{kind}` callback"
    try:
        yield
    finally:
        _state.busy = outer


def attach_recovered(error: BaseException, values, replace: bool = False) -> None:
    """Record on ``error`` the values an op handed back (unless a deeper op already did, or
    ``replace``: a combinator's fuller account of every value it took)."""
    if replace or getattr(error, "recovered", None) is None:
        try:
            error.recovered = values
        except AttributeError:                    # exceptions without a __dict__
            pass


def note_built(op) -> None:
    """Record an op built while a ``then``/``map`` callback runs on this thread (so that, if
    the callback fails, the values it moved into that op come back: ``collecting_built``)."""
    built = getattr(_state, "built", None)
    if built is not None:
        built.append(op)


@contextlib.contextmanager
def collecting_built():
    """Collect the ops built inside the block; if it raises, abandon those that never ran
    (their arguments are handed back) before the error propagates."""
    outer = getattr(_state, "built", None)
    built = _state.built = []
    try:
        yield
    except BaseException:
        abandon_all(built)
        raise
    finally:
        _state.built = outer


def abandon_all(ops) -> None:
    """``op._abandon()`` for each op of ``ops`` that never ran (its values are handed back),
    each again while an interrupt cuts it short (abandoning is idempotent); then the first
    interrupt is raised."""
    first = None
    for op in ops:
        while True:
            try:
                op._abandon()
                break
            except BaseException as e:
                first = first or e
                if not isinstance(e, KeyboardInterrupt):
                    break
    if first is not None:
        raise first


def abandon_and_finish(op, ctx: RunContext) -> None:
    """An execution of ``op`` failed: hand back what the parts of ``op`` that never ran hold,
    let the work already enqueued complete, then end its borrows and hand back its values.
    Every step runs even if an earlier one raises (the execution's error is the one to
    report, so theirs are dropped). A step an interrupt cuts short (at its entry, say) runs
    again: both are idempotent, and what they hand back comes back nowhere else."""
    for step in (op._abandon, lambda: finish_when_complete(ctx)):
        while True:
            try:
                step()
                break
            except KeyboardInterrupt:
                continue
            except BaseException:
                break


def finish_when_complete(ctx: RunContext) -> None:
    """``ctx.finish()`` once the work enqueued on its stream is complete: an execution's
    borrows may end, and its values come back, only then. An interrupted wait (a
    ``KeyboardInterrupt`` raised before or during it) waits again; a device error ends it
    (that work will never complete)."""
    if ctx.stream is not None:
        while True:
            try:
                ctx.stream.synchronize()
                break
            except KeyboardInterrupt:
                continue
            except BaseException:
                break
    finish_fully(ctx)


def finish_fully(ctx: RunContext) -> None:
    """``ctx.finish()``, called again while an interrupt cuts it short (what an execution
    owes is handed back only there); then the first interrupt or failure is raised."""
    first = None
    while True:
        try:
            ctx.finish()
            break
        except Exception as e:                    # a release failed; the others have run
            first = first or e
            break
        except BaseException as e:
            first = first or e
    if first is not None:
        raise first


def refuse_inside_recording(op, what: str) -> None:
    """Running an op inside a graph scope's block would run it now, outside the graph being
    recorded, which is never what the block means: raise, leaving ``op`` unrun (its values
    stay in it, so it can still be recorded)."""
    reason = allocation_forbidden()
    if reason is not None:
        raise GraphCaptureError(f"{what} inside {reason} would run {op!r} now, outside the "
                                f"graph it records; record it with s.record(op) instead, or "
                                f"run it before the scope")


def refused(error: BaseException, op) -> None:
    """``op`` was refused before it started: it still holds its values (it can run or be
    recorded later, and hands them back when dropped); ``error.recovered`` names them, so a
    value made for the call (an inline ``t.partition(...)``) is not lost."""
    attach_recovered(error, op._values())


def enqueue(op, stream, what: str):
    """Start an execution of ``op`` on ``stream`` (default: torch's current stream) and
    enqueue its work; returns ``(ctx, output)``, the caller finishes ``ctx`` once the work is
    complete. If enqueueing fails, the work already enqueued completes, every value is handed
    back and the error propagates. ``what`` names the caller for the re-entrancy error."""
    # `with executing(what)`, inlined: this is the per-op hot path of eager and async code.
    if getattr(_state, "busy", None) is not None:
        with executing(what):                    # raises ExecutionError
            pass
    owner = borrows._owner
    try:
        if _guarded():                           # maybe inside a graph scope's block
            refuse_inside_recording(op, what)
        handle = streams.resolve(stream)
        outer_owner = getattr(owner, "ctx", None)
    except BaseException as e:
        refused(e, op)
        raise
    # Marked busy only right before the block that unmarks it: an interrupt landing at a
    # call in between would leave the thread marked, refusing every later execution.
    _state.busy = "execution"
    try:
        ctx = RunContext(handle)
        owner.ctx = ctx                          # `with borrows.owned_by(ctx)`, inlined
        try:
            if stream is None:                   # already torch's current stream
                out = op._run(ctx)
            else:
                with streams.using(ctx.stream):
                    out = op._run(ctx)
        except BaseException:
            while True:                          # again if interrupted as it is entered
                try:
                    abandon_and_finish(op, ctx)
                    break
                except KeyboardInterrupt:
                    continue
            raise
    finally:
        owner.ctx = outer_owner
        _state.busy = None
    return ctx, out
