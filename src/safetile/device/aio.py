"""``await op``: submit on the event-loop thread, complete without blocking the loop.

GPU path: the op is enqueued on the loop thread (launching is cheap and non-blocking). Ops
submitted in one loop iteration are batched: at the end of the iteration one CUDA event per
stream is recorded after all of them and handed to the *reactor*, a daemon thread that
waits on events in order (``event.synchronize()``, which releases the GIL), finishes each
op of the batch (ends its borrows, hands its values back) and then posts one
``call_soon_threadsafe`` per batch to the loop, which resolves the futures. The loop thread
never spins or blocks.

Shapes: ``await op`` submits at once and waits on the op's future (no coroutine or Task of
its own). ``st.submit(op)`` returns that ``asyncio.Future``: ``asyncio.gather`` of futures
costs a done-callback per op, while gathering ops (or coroutines) makes a Task per op, which
costs more than launching the op itself.

CPU path (no CUDA, or work on the CPU executor): the whole execution (``op.sync()``) runs on
the loop's default executor, off the loop thread, so other coroutines keep running. The
executions awaited from one loop run one at a time, in submission order (``_Lane``).

Errors raised while running come back to the awaiting coroutine as the same exception,
after every argument has been handed back (``e.recovered`` holds the values, see execution.py).

Cancellation cannot stop work already on the GPU (or running on the CPU executor). A
cancelled ``await op`` therefore raises ``asyncio.CancelledError`` only once that work has
completed and every value has been handed back; the error carries the op's output as
``e.recovered`` (so a value made for the call, an inline ``t.partition(...)``, is not lost;
``asyncio.timeout`` raises ``TimeoutError`` from it: ``e.__cause__.recovered``). A future
from ``st.submit`` that is cancelled resolves nothing; ``await st.recovered(fut)`` gives the
output once the work has completed.
"""
from __future__ import annotations

import asyncio
import collections
import contextvars
import queue
import threading
import weakref

from ..errors import ArgumentError, ExecutionError
from . import streams
from .execution import _state, enqueue, executing, refuse_inside_recording, refused
from .op import DeviceOp
from .unsafe_block import in_unsafe_block, on_behalf


def submit(op, stream=None) -> "asyncio.Future":
    """Submit ``op`` (on ``stream``, default torch's current stream) from the running event
    loop and return an ``asyncio.Future`` of its output (``st.submit``; ``await op`` uses it).

    The future is a real asyncio future, so ``asyncio.gather(*futures)`` waits on it directly
    (no Task per op, unlike gathering ops or coroutines). GPU work is enqueued now, on the
    loop thread; the future resolves once the work is complete and every value has been
    handed back. Errors raised while enqueueing are raised here, after the values were
    handed back (``e.recovered``); errors found at completion are set on the future.
    Cancelling the future does not stop the work: its values are still handed back (to the
    op's arguments' handles) when it completes, and ``await st.recovered(fut)`` gives them."""
    return _submit(op, stream, "st.submit(op)")


def _submit(op, stream, how: str) -> "asyncio.Future":
    """:func:`submit`, whose errors name ``how`` it was asked for (``await op`` too)."""
    if getattr(_state, "busy", None) is not None:     # inside a callback: re-entrant
        with executing(how):                          # raises ExecutionError
            pass
    if not isinstance(op, DeviceOp):
        raise ExecutionError(f"st.submit(op) takes a DeviceOp, got {type(op).__name__} "
                             f"{op!r:.80} (a graph runs as g.launch())")
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        error = ExecutionError(f"{how} needs a running event loop: call it from a "
                               f"coroutine (or run the op with op.sync()); the op did not "
                               f"start")
        refused(error, op)
        try:
            raise error from None
        finally:
            del error           # no frame -> error -> traceback -> frame cycle keeps the op
    if stream is not None:
        try:
            streams.resolve(stream)              # ArgumentError here, not on the future
        except BaseException as e:
            refused(e, op)
            raise
    if not streams.cuda_available() or op._host_bound():
        try:
            refuse_inside_recording(op, how)
        except BaseException as e:
            refused(e, op)
            raise
        # The awaiting code's context (st.backend, st.unsafe) goes with the op to the thread.
        fut = _OpFuture(loop=loop)
        marked = in_unsafe_block()

        def work():
            try:
                with on_behalf(marked):
                    out, error = op.sync(stream), None
            except BaseException as e:        # delivered to the awaiter
                out, error = None, e
            try:
                loop.call_soon_threadsafe(_settle_all, [(fut, out, error)])
            except RuntimeError:              # the loop closed meanwhile: nothing to tell
                pass
        try:
            _lane_of(loop).run(loop, contextvars.copy_context().run, work)
        except BaseException as e:            # e.g. the loop's executor was shut down
            refused(e, op)
            raise
        return fut
    ctx, out = enqueue(op, stream, how)
    fut = _OpFuture(loop=loop)
    b = _last
    if b is None or b.loop_ref() is not loop:
        b = _batch_for(loop)
    b.add(ctx, out, fut, loop)
    return fut


async def run_async(op, stream=None):
    """Run ``op`` (on ``stream``, default torch's current stream) and return its output."""
    return await submit(op, stream)


class _Lane:
    """The host-run executions submitted from one loop, run one at a time in submission
    order on the loop's default executor, as the ops awaited on the GPU run in order on one
    stream. So one task's op never meets another task's unfinished execution on another
    thread (a shared op two tasks consume runs once and reaches both, as on the GPU)."""

    __slots__ = ("lock", "queue", "busy")

    def __init__(self):
        self.lock = threading.Lock()
        self.queue: collections.deque = collections.deque()
        self.busy = False                     # a drain is scheduled or running

    def run(self, loop, *call) -> None:
        """Run ``call`` after the executions submitted before it (raises, running nothing,
        if the executor refuses work)."""
        with self.lock:
            self.queue.append(call)
            if self.busy:
                return
            self.busy = True
        try:
            loop.run_in_executor(None, self.drain)
        except BaseException:
            with self.lock:
                self.queue.remove(call)
                self.busy = False
            raise

    def drain(self) -> None:
        while True:
            with self.lock:
                if not self.queue:
                    self.busy = False
                    return
                fn, *args = self.queue.popleft()
            try:
                fn(*args)                     # (delivers its own errors to its future)
            except BaseException:             # never leave the later executions unrun
                pass


_lanes: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _lane_of(loop) -> _Lane:
    lane = _lanes.get(loop)
    if lane is None:
        lane = _lanes[loop] = _Lane()
    return lane


class _Batch:
    """The ops submitted on one loop during the current iteration, grouped by stream.

    The batch refers to its loop weakly (``loop_ref``), and strongly (``loop``) only while a
    flush is scheduled, so that the per-loop registry does not keep closed loops alive."""

    __slots__ = ("loop_ref", "loop", "pending", "__weakref__")

    def __init__(self, loop):
        self.loop_ref = weakref.ref(loop)
        self.loop = None                      # set while a flush is scheduled
        self.pending: dict = {}               # stream -> [(ctx, out, fut)]

    def add(self, ctx, out, fut, loop) -> None:
        entries = self.pending.get(ctx.stream)
        if entries is None:
            entries = self.pending[ctx.stream] = []
        entries.append((ctx, out, fut))
        if self.loop is None:
            self.loop = loop
            loop.call_soon(self.flush)
            _scheduled.add(self)
            if not _the_reactor:                  # it watches for orphans from now on
                _reactor()

    def flush(self) -> None:
        """Hand the batch to the reactor: on the loop, at the end of the iteration; on the
        reactor thread, if the loop was closed with this call still to run."""
        import torch
        _scheduled.discard(self)
        loop, self.loop = self.loop, None
        pending, self.pending = self.pending, {}
        for stream, entries in pending.items():
            try:
                event = torch.cuda.Event()
                event.record(stream)
            except Exception as e:            # e.g. a device fault: every awaiter sees it
                event = e
            _reactor().put((event, loop, entries))


_batches: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_last: _Batch | None = None                   # the batch used last (most calls: the same loop)
# Batches whose flush is scheduled on their loop. A loop stopped in the iteration that
# scheduled it and then closed drops the call: the reactor flushes those batches itself
# (``_flush_orphans``), so that their work still ends its borrows and hands its values back.
_scheduled: set = set()
#: How often (seconds) the idle reactor looks for such batches.
ORPHAN_POLL_S = 0.05


def _batch_for(loop) -> _Batch:
    global _last
    b = _batches.get(loop)
    if b is None:
        b = _batches[loop] = _Batch(loop)
    _last = b
    return b


def _finish_all(entries, error) -> list:
    """The work of ``entries`` is complete (or failed with ``error``): end their borrows and
    hand their values back; ``(future, output, error)`` of each."""
    done = []
    for ctx, out, fut in entries:
        try:
            ctx.finish()
        except BaseException as e:            # a release failed: report it to the awaiter
            done.append((fut, out, e))
            continue
        done.append((fut, out, error))
    return done


def _settle_all(done, start: int = 0) -> None:
    """On the loop thread: resolve each future of ``_finish_all``'s list from ``start``. An
    interrupt landing here leaves the rest to a callback of their own, which the loop runs
    when it runs again (``_settle`` may run twice for the future it cut short)."""
    i = start
    try:
        while i < len(done):
            _settle(*done[i])
            i += 1
    finally:
        if i < len(done):
            done[i][0].get_loop().call_soon(_settle_all, done, i)


class _OpFuture(asyncio.Future):
    """The future of a submitted op. ``late``: once it is cancelled, ``("done", out, error)``
    when its work has completed, or ``("wait", [futures])`` while awaiters of ``recovered``
    wait for that. Kept on the future, not in a registry keyed by it: the error's traceback
    reaches the frames that delivered it, which refer to the future, and an entry of a weak
    registry whose value reaches its own key is never dropped (nor the values it holds)."""

    __slots__ = ("late",)

    def __init__(self, *, loop):
        super().__init__(loop=loop)
        self.late = None


def _settle(fut, out, error) -> None:
    """The work of ``fut`` is complete and its values are handed back: resolve ``fut``, or,
    if it was cancelled, keep the output for ``recovered`` (and wake its waiters)."""
    if not fut.done():
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(out)
        return
    if not fut.cancelled():
        return
    rec = fut.late
    if rec is not None and rec[0] == "wait":
        for late in rec[1]:
            if not late.done():
                late.set_result((out, error))
    fut.late = ("done", out, error)


async def recovered(fut):
    """``st.recovered``: the output of an ``st.submit`` future's op once its work has
    completed, also when the future was cancelled (further cancellations of the waiting task
    are held off until then); for a failed op, the values its error recovered."""
    if not isinstance(fut, _OpFuture):
        raise ArgumentError(
            f"st.recovered(fut) takes a future made by st.submit(op), got "
            f"{type(fut).__name__}; an `await op` or op.sync() that fails or is cancelled "
            f"carries the op's values as error.recovered instead")
    out, error = await _outcome(fut)
    if error is not None and getattr(error, "recovered", None) is not None:
        return error.recovered
    return out


async def _outcome(fut):
    """``(out, error)`` of ``fut``'s op once its work has completed, cancelled or not."""
    while not fut.done():
        try:
            await asyncio.wait([fut])
        except asyncio.CancelledError:
            continue
    if not fut.cancelled():
        error = fut.exception()
        return (None, error) if error is not None else (fut.result(), None)
    rec = fut.late
    if rec is not None and rec[0] == "done":
        return rec[1], rec[2]
    late = asyncio.get_running_loop().create_future()
    if rec is None:
        fut.late = ("wait", [late])
    else:
        rec[1].append(late)
    while not late.done():
        try:
            await asyncio.shield(late)
        except asyncio.CancelledError:
            continue
    return late.result()


def await_op(op):
    """``await op`` (``DeviceOp.__await__``): the output; if the awaiting task is cancelled,
    ``CancelledError`` once the work has completed, with ``e.recovered`` (and the op's own
    error, if it failed, as its ``__cause__``)."""
    fut = _submit(op, None, "await op")
    try:
        return (yield from fut.__await__())
    except asyncio.CancelledError as e:
        # The task may be cancelled after the work completed, before it resumed: the
        # future then holds the outcome.
        out, error = yield from _outcome(fut).__await__()
        rec = getattr(error, "recovered", None) if error is not None else None
        e.recovered = rec if rec is not None else out
        if error is not None:
            e.__cause__ = error
        raise


class _Reactor:
    """A daemon thread that waits for CUDA events and wakes the loop that is waiting."""

    def __init__(self):
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._main, name="safetile-reactor", daemon=True)
        self.thread.start()

    def put(self, item) -> None:
        self.queue.put(item)

    def _main(self) -> None:
        # Values are handed back here, before the loop hears of it: a loop that stops, or
        # closes (dropping the callbacks it was sent), before it runs the callback that
        # resolves the futures then loses no value and leaves no borrow held.
        while True:
            try:
                self._complete(*self.queue.get(timeout=ORPHAN_POLL_S))
            except queue.Empty:
                pass
            if _scheduled:
                _flush_orphans()

    @staticmethod
    def _complete(event, loop, entries) -> None:
        """Wait for ``event`` (or take the error recording it raised), finish ``entries`` and
        post their outcomes to ``loop``."""
        error = event if isinstance(event, Exception) else None
        if error is None:
            try:
                event.synchronize()
            except BaseException as e:        # e.g. a device fault: every awaiter sees it
                error = e
        done = _finish_all(entries, error)
        try:
            loop.call_soon_threadsafe(_settle_all, done)
        except RuntimeError:                  # the loop was closed: no awaiter is left
            pass


def _flush_orphans() -> None:
    """Flush the scheduled batches whose loop is closed (on the reactor thread). A closed loop
    never runs again, so nothing else flushes them, and none can be flushed twice."""
    for batch in list(_scheduled):
        loop = batch.loop
        if loop is not None and loop.is_closed():
            batch.flush()


_the_reactor: list = []
_reactor_lock = threading.Lock()


def _reactor() -> _Reactor:
    if not _the_reactor:
        with _reactor_lock:
            if not _the_reactor:
                _the_reactor.append(_Reactor())
    return _the_reactor[0]
