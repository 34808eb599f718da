"""``Scoped``: a value in force while a block runs, for the code that runs the block only.

A graph scope's state (allocation refused, Shared values collected as the recording's) must
reach the code that records, and nothing else: not another thread, and not another asyncio
task of the same thread, which may run while the recording task awaits inside its block.
So the values live in a ``ContextVar`` (one immutable tuple per context, set and reset by
the block), and each entry also names the thread and the task that entered the block: a
task or thread started inside the block copies the context, entries included, but is not
their owner, so it does not see them. An entry is marked closed when its block ends, since
such a copy may outlive the block.
"""
from __future__ import annotations

import contextlib
import threading
from asyncio import current_task
from asyncio.events import _get_running_loop
from contextvars import ContextVar


def _runner() -> tuple:
    """The thread and the asyncio task (None outside one) running now."""
    loop = _get_running_loop()
    return threading.get_ident(), (current_task(loop) if loop is not None else None)


class _Entry:
    __slots__ = ("value", "runner", "open")

    def __init__(self, value, runner):
        self.value, self.runner, self.open = value, runner, True


class Scoped:
    """A stack of values, each seen by the thread and task whose ``entered`` block set it."""

    __slots__ = ("var",)

    def __init__(self, name: str):
        #: The context's entries, innermost last; empty (falsy) outside every block, which
        #: is all a hot path needs to read.
        self.var: ContextVar[tuple] = ContextVar(name, default=())

    @contextlib.contextmanager
    def entered(self, value):
        """``value`` is the innermost value for this thread and task while the block runs."""
        entry = _Entry(value, _runner())
        token = self.var.set(self.var.get() + (entry,))
        try:
            yield
        finally:
            entry.open = False
            try:
                self.var.reset(token)
            except ValueError:                   # left in another context: closed is enough
                pass

    def current(self):
        """The innermost value whose block this thread and task are running, or None."""
        entries = self.var.get()
        if not entries:
            return None
        me = _runner()
        for entry in reversed(entries):
            if entry.open and entry.runner == me:
                return entry.value
        return None
