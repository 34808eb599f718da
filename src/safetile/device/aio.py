"""``await op``: submit on the event-loop thread, complete without blocking the loop.

GPU path: the op is enqueued on the loop thread (launching is cheap and non-blocking). Ops
submitted in one loop iteration are batched: at the end of the iteration one CUDA event per
stream is recorded after all of them and handed to the *reactor*, a daemon thread that
waits on events in order (``event.synchronize()``, which releases the GIL) and then posts
one ``call_soon_threadsafe`` per batch to the loop. The loop thread never spins or blocks;
the completion step settles each op (hands its values back) and resolves its future.

CPU path (no CUDA, or work on the CPU executor): the whole execution (``op.sync()``) runs on
the loop's default executor, off the loop thread, so other coroutines keep running.

Errors raised while running come back to the awaiting coroutine as the same exception,
after every argument has been handed back (``e.recovered`` holds the values, see op.py).
"""
from __future__ import annotations

import asyncio
import queue
import threading
import weakref

from . import streams
from .op import RunContext, _state, executing


async def run_async(op, stream=None):
    """Run ``op`` (on ``stream``, default torch's current stream) and return its output."""
    loop = asyncio.get_running_loop()
    if not streams.cuda_available() or op._host_bound():
        return await loop.run_in_executor(None, op.sync, stream)
    fut = loop.create_future()
    # `with executing("await op")`, inlined: submission is the per-op hot path of async code.
    if getattr(_state, "busy", None) is not None:
        with executing("await op"):             # raises ExecutionError
            pass
    _state.busy = "execution"
    try:
        ctx = RunContext(streams.resolve(stream))
        try:
            if stream is None:
                out = op._run(ctx)
            else:
                with streams.using(ctx.stream):
                    out = op._run(ctx)
        except BaseException:
            op._abandon()
            ctx.stream.synchronize()            # rare: let enqueued work finish, then hand back
            ctx.settle()
            raise
    finally:
        _state.busy = None
    _batch_for(loop).add(ctx, out, fut)
    return await fut


class _Batch:
    """The ops submitted on one loop during the current iteration, grouped by stream."""

    def __init__(self, loop):
        self.loop = loop
        self.pending: dict = {}               # stream -> [(ctx, out, fut)]
        self.scheduled = False

    def add(self, ctx, out, fut) -> None:
        entries = self.pending.get(ctx.stream)
        if entries is None:
            entries = self.pending[ctx.stream] = []
        entries.append((ctx, out, fut))
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        import torch
        self.scheduled = False
        pending, self.pending = self.pending, {}
        for stream, entries in pending.items():
            event = torch.cuda.Event()
            event.record(stream)
            _reactor().put((event, self.loop, entries))


_batches: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _batch_for(loop) -> _Batch:
    b = _batches.get(loop)
    if b is None:
        b = _batches[loop] = _Batch(loop)
    return b


def _complete(entries, error) -> None:
    """On the loop thread: hand values back and resolve the futures."""
    for ctx, out, fut in entries:
        try:
            ctx.settle()
        except BaseException as e:            # a release failed: report it to the awaiter
            if not fut.done():
                fut.set_exception(e)
            continue
        if fut.done():                        # cancelled while in flight: values are back
            continue
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(out)


class _Reactor:
    """A daemon thread that waits for CUDA events and wakes the loop that is waiting."""

    def __init__(self):
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._main, name="safetile-reactor", daemon=True)
        self.thread.start()

    def put(self, item) -> None:
        self.queue.put(item)

    def _main(self) -> None:
        while True:
            event, loop, entries = self.queue.get()
            error = None
            try:
                event.synchronize()
            except BaseException as e:        # e.g. a device fault: every awaiter sees it
                error = e
            try:
                loop.call_soon_threadsafe(_complete, entries, error)
            except RuntimeError:              # the loop was closed: hand values back here
                for ctx, _, _ in entries:
                    try:
                        ctx.settle()
                    except BaseException:
                        pass


_the_reactor: list = []
_reactor_lock = threading.Lock()


def _reactor() -> _Reactor:
    if not _the_reactor:
        with _reactor_lock:
            if not _the_reactor:
                _the_reactor.append(_Reactor())
    return _the_reactor[0]
