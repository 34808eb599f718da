"""Combinators: ``then``, ``map``, ``st.zip`` and ``shared`` (``first``/``last`` are maps).

All of them are lazy: building one runs nothing. They run inside the execution that runs
them (``sync``, ``await``, a graph record), on that execution's stream, so the work of one
combinator tree is ordered in the order its parts are listed.

Handing values to callbacks: ``then`` and ``map`` settle the execution (hand every value
produced so far back to its owner) before calling the user's function, so the function can
move the values on into the next launch. Work enqueued later on the same stream is ordered
after the earlier work, which is what makes the early hand-back safe for the chained ops.
"""
from __future__ import annotations

import inspect
import threading

from ..errors import ArgumentError, ExecutionError
from .execution import (UNKNOWN, RunContext, _state, abandon_all, attach_recovered,
                        collecting_built, in_callback, refused, spread)
from .op import DeviceOp, fail_in_sequence


def _check_op(value, what: str) -> DeviceOp:
    if not isinstance(value, DeviceOp):
        raise ExecutionError(f"{what} must be a DeviceOp, got {type(value).__name__} {value!r}"
                             f"{' (use op.map(f) for host-side transforms)' if 'then' in what else ''}")
    return value


def async_error(kind: str, f, returned=None) -> ExecutionError:
    """The error for a ``kind`` callback ``f`` that is async (or ``returned`` an awaitable)."""
    # A callback runs synchronously, inside the execution: nothing would ever await what it
    # returns. A coroutine it returned was made by this call, so it is closed (never run,
    # and never reported as "never awaited").
    if inspect.iscoroutine(returned):
        returned.close()
    name = getattr(f, "__name__", repr(f))
    what = "is a coroutine function (async def)" if returned is None or \
        inspect.iscoroutinefunction(f) else f"returned an awaitable ({type(returned).__name__})"
    result = "the next op" if kind == "then" else "its value"
    return ExecutionError(f"the `{kind}` callback {name} {what}: a callback runs "
                          f"synchronously, inside the execution, and cannot await; write it "
                          f"as a plain def that returns {result}, and await in the coroutine "
                          f"that awaits the op")


def refuse_async(kind: str, f, op: DeviceOp) -> None:
    """Raise when ``f`` is an ``async def``, as ``op.then(f)`` / ``op.map(f)`` is built."""
    # A function's (or bound method's) code flags answer without inspect's unwrapping, which
    # every op of a chain would pay, and so does a class that sets ``_st_sync_call`` (calling
    # an instance never makes a coroutine: a kernel); a partial or another callable asks inspect.
    code = getattr(f, "__code__", None)
    if code is None and getattr(type(f), "_st_sync_call", False):
        return
    if code.co_flags & inspect.CO_COROUTINE if code is not None else \
            inspect.iscoroutinefunction(f):
        err = async_error(kind, f)
        refused(err, op)             # the op is untouched: it may still run, with another f
        raise err


def _check_result(value, f) -> None:
    """Raise for a `then` callback's result that is not an op."""
    if inspect.isawaitable(value):
        raise async_error("then", f, value)
    _check_op(value, "the value returned by a `then` callback")


def callback_account(error: BaseException, given) -> object:
    """What the error a callback raised recovers: the values it was ``given`` or, when a
    launch inside it attached an account of its own, ``(given, that account)`` (a value the
    callback moved into a handle it made, ``z.unpartition().partition(...)``, is found
    only in the second)."""
    inner = getattr(error, "recovered", None)
    return given if inner is None else (given, inner)


def arity_error(kind: str, f, out, source) -> ArgumentError | None:
    """The error to raise when the ``kind`` callback ``f`` raised a TypeError because it
    cannot take the values ``out`` spreads into (None if the TypeError came from inside f)."""
    values = spread(out)
    try:
        signature = inspect.signature(f)
    except (TypeError, ValueError):              # none to read (a C callable, a malformed
        return None                              # __signature__): f's own error stands
    try:
        signature.bind(*values)
        return None
    except TypeError:
        pass
    named = source.value_names() if hasattr(source, "value_names") else None
    if named is not None and len(values) == len(named[0]):
        names, what = named
    else:
        names = [f"v{i}" for i in range(len(values))]
        what = f"the output of {source!r}"
    name = getattr(f, "__name__", repr(f))
    return ArgumentError(f"the `{kind}` callback {name}{signature} cannot take the "
                         f"{len(values)} value(s) it receives: {what}. Write it as "
                         f"`lambda {', '.join(names)}: ...` (or `lambda *values: ...`)")


class ThenOp(DeviceOp):
    """``prev.then(f)``: run ``prev``, hand its values back, run the op ``f(*values)`` returns."""

    __slots__ = ("prev", "f")

    def __init__(self, prev: DeviceOp, f):
        if not callable(f):
            raise ArgumentError(f"op.then(f) needs a callable, got {f!r}")
        refuse_async("then", f, prev)
        self.prev, self.f = prev, f

    def __repr__(self) -> str:
        return _chain_repr(self)

    def _run(self, ctx: RunContext):
        return _run_chain(self, ctx)

    def _follow(self, ctx: RunContext, out, source):
        """This link's step once what it follows gave ``out``: the callback, then its op."""
        state, turn = _state, ctx.turn
        # Each link runs once, also over a shared op; claimed only once what it follows
        # has run, so that a refusal of that (a shared op in flight elsewhere) leaves it
        # to run later.
        self._take()
        f = self.f
        ctx.settle()          # the next op runs on ctx.stream: ordered after this work
        # `with in_callback("then")`, inlined (this runs once per chained op)
        outer = getattr(state, "busy", None)
        state.busy = "`then` callback"
        outer_built = getattr(state, "built", None)
        state.built = built = []          # `with collecting_built()`, inlined
        try:
            args = out if type(out) is tuple else (out,)
            nxt = f(*args) if turn is None else turn.run(f, args)
            if not isinstance(nxt, DeviceOp):
                _check_result(nxt, f)
        except BaseException as e:
            abandon_all(built)            # ops the callback built: values come back
            wrong = arity_error("then", f, out, source) if type(e) is TypeError else None
            attach_recovered(wrong or e, callback_account(e, out), replace=True)
            if wrong is not None:
                raise wrong from e
            raise
        finally:
            state.busy = outer
            state.built = outer_built
        ctx.last = UNKNOWN    # the callback may have enqueued work of its own
        try:
            out = nxt._run(ctx)
        except BaseException as e:    # (an op that already ran took none of them)
            abandon_all(built)            # built by the callback, never to run now (one
            attach_recovered(e, out)      # held only by a closure of nxt, say)
            raise
        return out, nxt

    def _abandon(self) -> None:
        _chain_base(self)._abandon()

    def _values(self):
        return _chain_base(self)._values()

    def _host_bound(self) -> bool:
        return _chain_base(self)._host_bound()


class MapOp(DeviceOp):
    """``op.map(f)``: the output is ``f(*values)``, computed on the host."""

    __slots__ = ("inner", "f")

    def __init__(self, inner: DeviceOp, f):
        if not callable(f):
            raise ArgumentError(f"op.map(f) needs a callable, got {f!r}")
        refuse_async("map", f, inner)
        self.inner, self.f = inner, f

    def __repr__(self) -> str:
        return _chain_repr(self)

    def _run(self, ctx: RunContext):
        return _run_chain(self, ctx)

    def _follow(self, ctx: RunContext, out, source):
        """This link's step once what it follows gave ``out``: the callback's value."""
        self._take()              # (after its op, as a `then` link is)
        ctx.settle()
        try:
            with in_callback("map"), collecting_built():
                turn = ctx.turn
                result = self.f(*spread(out)) if turn is None else turn.run(self.f, spread(out))
                if isinstance(result, DeviceOp):      # the op it built is handed back
                    raise ArgumentError(
                        f"the `map` callback {getattr(self.f, '__name__', self.f)!r} returned "
                        f"{result!r}, which would never run: a `map` callback computes on the "
                        f"host; to run an op on these values, use op.then(f)")
                if inspect.iscoroutine(result):       # (a Future it returns is a value)
                    raise async_error("map", self.f, result)
                return result, self
        except BaseException as e:
            wrong = arity_error("map", self.f, out, self.inner) if type(e) is TypeError else None
            attach_recovered(wrong or e, callback_account(e, out), replace=True)
            if wrong is not None:
                raise wrong from e
            raise
        finally:
            ctx.last = UNKNOWN    # the callback may have enqueued work of its own

    def _abandon(self) -> None:
        _chain_base(self)._abandon()

    def _values(self):
        return _chain_base(self)._values()

    def _host_bound(self) -> bool:
        return _chain_base(self)._host_bound()


def _links(op: DeviceOp) -> tuple[DeviceOp, list]:
    """The op a chain of `then` and `map` links starts from, and the links in run order."""
    links = []
    while isinstance(op, (ThenOp, MapOp)):
        links.append(op)
        op = op.prev if isinstance(op, ThenOp) else op.inner
    links.reverse()
    return op, links


def _chain_base(op: DeviceOp) -> DeviceOp:
    """The op a chain of `then` and `map` links starts from (the one that holds its values)."""
    return _links(op)[0]


def _chain_repr(top: DeviceOp) -> str:
    """``<ThenOp <MapOp <KernelOp ...> -> 'f'> -> 'g'>``, built without recursion; a long
    chain shows its first and last links."""
    base, links = _links(top)
    text = repr(base)
    shown = links if len(links) <= 8 else links[:3] + [None] + links[-4:]
    for link in shown:
        if link is None:
            text = f"<... {len(links) - 7} links ... {text}>"
            continue
        name = getattr(link.f, "__name__", link.f)
        text = f"<{type(link).__name__} {text} -> {name!r}>"
    return text


def _run_chain(top: DeviceOp, ctx: RunContext):
    """Run a chain of `then` and `map` links ending at ``top``: iterative, not recursive, so
    that a chain of thousands of links does not exhaust the stack."""
    base, links = _links(top)
    out, source = base._run(ctx), base
    for link in links:
        out, source = link._follow(ctx, out, source)
    return out


class ZipOp(DeviceOp):
    """``st.zip(a, b, ...)``: runs each op in order; the output is the tuple of outputs."""

    __slots__ = ("ops",)

    def __init__(self, ops):
        try:
            self.ops = tuple(_check_op(op, f"st.zip argument {i}") for i, op in enumerate(ops))
        except ExecutionError as e:               # they will never run: values come back
            abandon_all([op for op in ops if isinstance(op, DeviceOp)])
            attach_recovered(e, tuple(op._values() if isinstance(op, DeviceOp) else op
                                      for op in ops))
            raise

    def __repr__(self) -> str:
        return f"<ZipOp of {len(self.ops)}>"

    def _run(self, ctx: RunContext):
        outs = []
        for i, op in enumerate(self.ops):
            try:
                outs.append(op._run(ctx))
            except BaseException as e:
                fail_in_sequence(e, outs, op, self.ops[i + 1:])
                raise
        self._take()              # (after its ops, as a `then` link is)
        return tuple(outs)

    def _abandon(self) -> None:
        for op in self.ops:
            op._abandon()

    def _values(self):
        return tuple(op._values() for op in self.ops)

    def _host_bound(self) -> bool:
        return any(op._host_bound() for op in self.ops)


def zip(*ops) -> DeviceOp:  # noqa: A001 - exported as st.zip
    """An op running ``ops`` in order whose output is the tuple of their outputs."""
    return ZipOp(ops)


class SharedOp(DeviceOp):
    """``op.shared()``: every consumer gets the one output of a single run of ``op``.

    The first consumer to run it runs the inner op (in its execution, on its stream). Later
    consumers get the same output; on a different CUDA stream they first wait on an event
    recorded after the inner work, so their work is ordered after it. Consumers of one
    shared op must all run in eager executions, or all inside the same graph recording. A
    consumer on another thread while the execution that ran it is unfinished (running it
    included) is refused (``ExecutionError``), never kept waiting.
    """

    def __init__(self, inner: DeviceOp):
        self.inner = _check_op(inner, "op.shared()'s op")
        self._lock = threading.Lock()
        self._done = False
        self._abandoned = False
        self._out = None
        self._error = None
        self._event = None
        self._stream = None
        self._recording = None
        self._turn = None                         # the graph-scope record it ran in, if any
        self._runner = None                       # the thread running the inner op
        self._ran_in = None                       # (execution, thread) that ran it, until it ends

    def __repr__(self) -> str:
        return f"<SharedOp {self.inner!r}{' ran' if self._done else ''}>"

    def _run(self, ctx: RunContext):
        if self._runner == threading.get_ident():
            raise ExecutionError(f"the shared op {self.inner!r} is consumed by its own run (a "
                                 f"callback of it returns or runs it again); it cannot wait "
                                 f"for itself")
        # Another thread running the inner op now is in an execution that has not finished,
        # so this consumer would be refused once it ends: refuse it now, not after a wait
        # that never ends if that run waits on this thread (a callback joining it).
        if not self._lock_unless(lambda: self._runner is not None):
            raise ExecutionError(
                f"the shared op {self.inner!r} is running in an execution of another "
                f"thread: its values are in flight there; consume it within that "
                f"execution (st.zip, then) or after it finishes")
        try:
            if not self._done:
                self._done = True
                self._recording = ctx.recording
                self._runner = threading.get_ident()
                try:
                    self._out = self.inner._run(ctx)
                except BaseException as e:
                    self._error = e
                    raise
                finally:
                    self._runner = None
                # Its values are that execution's until it finishes: a `then` callback may
                # move them on into later launches of it (the release deferred at its finish
                # runs after every hand-back deferred before).
                self._ran_in = (ctx, threading.get_ident())
                ctx._finish.append(lambda: ctx.defer(self._settled))
                self._turn = ctx.turn
                if ctx.stream is not None and ctx.recording is None:
                    import torch
                    self._event = torch.cuda.Event()
                    self._event.record(ctx.stream)
                    self._stream = ctx.stream
                return self._out
        finally:
            self._lock.release()
        if self._abandoned:
            err = ExecutionError(f"the shared op {self.inner!r} never ran: an execution that "
                                 f"consumed it failed first, and its values were handed back "
                                 f"(e.recovered); build the op again to run it")
            attach_recovered(err, self.inner._values())
            raise err
        if self._error is not None:
            raise ExecutionError(f"the shared op {self.inner!r} failed when its first consumer "
                                 f"ran it: {self._error!r}") from self._error
        ran_in = self._ran_in
        if ran_in is not None and ran_in[0] is not ctx and ran_in[1] != threading.get_ident():
            # (Executions of one thread finish, and hand back, in the order they started.)
            raise ExecutionError(
                f"the shared op {self.inner!r} ran in an execution of another thread that has "
                f"not finished: its values are still in flight there; consume it within that "
                f"execution (st.zip, then) or after it finishes")
        if ctx.recording is not self._recording:
            raise ExecutionError("a shared op was consumed both inside and outside a graph "
                                 "recording (or in two recordings); consume it in one of them")
        if self._turn is not None and self._turn.failed:
            raise ExecutionError(f"the shared op {self.inner!r} ran in a record that failed, "
                                 f"so its launches were dropped from the graph; build the op "
                                 f"again to record it")
        if self._event is not None and ctx.stream is not None and ctx.stream != self._stream:
            ctx.stream.wait_event(self._event)
        return self._out

    def _lock_unless(self, stop) -> bool:
        """Take ``_lock``, or return False once ``stop()`` is true while another thread holds
        it: a run holds it for as long as it runs, and may wait on this thread meanwhile. The
        lock is otherwise held only briefly, so waiting for it is polled."""
        locked = self._lock.acquire(blocking=False)
        while not locked:
            if stop():
                return False
            locked = self._lock.acquire(timeout=0.001)
        return True

    def _settled(self) -> None:
        self._ran_in = None

    def _abandon(self) -> None:
        # An execution that consumed this op failed before running it. Its values come back
        # now (the error's `recovered` names them), so no later consumer may run it. A run in
        # progress (on another thread) keeps its values: nothing to wait for.
        if not self._lock_unless(lambda: self._done):
            return
        try:
            if self._done:
                return
            self._done = self._abandoned = True
        finally:
            self._lock.release()
        self.inner._abandon()

    def _values(self):
        return self._out if self._done and not self._abandoned else self.inner._values()

    def _host_bound(self) -> bool:
        return not self._done and self.inner._host_bound()

