"""``DeviceOp``: a lazy unit of device work whose output is the values it hands back.

An op runs inside a ``RunContext`` (a stream and the releases still owed). ``_run`` enqueues
the work and returns the op's output values; the values' ownership is restored by the
context's *settle* step, after the work is known to be ordered before any later use: at
``sync`` (after the stream is synchronized), at completion of ``await``, or before a ``then``
callback (whose next op runs on the same stream, so it is ordered after this one).
"""
from __future__ import annotations

import threading

import torch

from ..errors import ExecutionError

_running = threading.local()


class RunContext:
    """Where and how one execution runs: a CUDA stream (or None on the CPU backend)."""

    def __init__(self, stream=None):
        self.stream = stream
        self._settle: list = []

    def defer(self, fn) -> None:
        """Run ``fn`` when the work enqueued so far is ordered before host use."""
        self._settle.append(fn)

    def settle(self) -> None:
        pending, self._settle = self._settle, []
        for fn in pending:
            fn()


def _default_stream(device=None):
    if torch.cuda.is_available():
        return torch.cuda.current_stream(device)
    return None


class DeviceOp:
    """Lazy device work. ``sync()`` runs it and returns its output values."""

    _consumed = False

    def _run(self, ctx: RunContext) -> tuple:
        """Enqueue the work on ``ctx.stream`` and return the output values."""
        raise NotImplementedError

    def _take(self) -> None:
        """Mark this op as executed; an op runs once (its arguments come back once)."""
        if self._consumed:
            raise ExecutionError(f"{self!r} has already run; its values were handed back then. "
                                 f"Capture it with op.graph() to run work repeatedly")
        self._consumed = True

    def _stream_for(self, stream):
        return stream if stream is not None else _default_stream()

    def sync(self, stream=None):
        """Run and block until done; returns the output values (a tuple, or one value)."""
        if getattr(_running, "depth", 0):
            raise ExecutionError("cannot start execution inside a running `then` callback; "
                                 "return the next op from the callback instead")
        ctx = RunContext(self._stream_for(stream))
        _running.depth = 1
        try:
            if ctx.stream is not None:
                with torch.cuda.stream(ctx.stream):
                    values = self._run(ctx)
                ctx.stream.synchronize()
            else:
                values = self._run(ctx)
        finally:
            _running.depth = 0
            ctx.settle()
        return values
