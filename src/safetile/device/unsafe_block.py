"""``st.unsafe()``: the marking of call sites where ``unsafe=True`` kernels may be launched."""
from __future__ import annotations

import contextvars
import sys

# The frames whose `with st.unsafe():` blocks are open in this context. A launch is marked when
# one of them is on its call stack: the block's own code and what it calls, never code that
# merely shares the context (a caller resuming a generator suspended inside a block, a task or
# callback scheduled from one), so the marking ends where the block does.
_open: contextvars.ContextVar = contextvars.ContextVar("safetile_unsafe", default=())


class unsafe:
    """Marks the call sites where ``unsafe=True`` kernels may be launched."""

    def __enter__(self):
        return self._open_at(sys._getframe(1))

    def _open_at(self, frame):
        self._frame = frame
        self._token = _open.set(_open.get() + (frame,))
        return self

    def __exit__(self, *exc):
        try:
            _open.reset(self._token)
        except ValueError:                # exited in another context (a generator closed there)
            _open.set(tuple(f for f in _open.get() if f is not self._frame))
        self._frame = None
        return False


class on_behalf:
    """Run a block as part of code that called ``in_unsafe_block()`` and got ``marked``: an
    op run on another thread for an ``await`` inside a ``with st.unsafe():`` block may launch
    unsafe kernels (its callbacks') as that code could."""

    def __init__(self, marked: bool):
        self._inner = unsafe() if marked else None

    def __enter__(self):
        if self._inner is not None:
            self._inner._open_at(sys._getframe(1))
        return self

    def __exit__(self, *exc):
        return self._inner.__exit__(*exc) if self._inner is not None else False


def in_unsafe_block() -> bool:
    """Whether the caller runs inside an open ``with st.unsafe():`` block."""
    frames = _open.get()
    if not frames:
        return False
    f = sys._getframe(1)
    while f is not None:
        if any(f is g for g in frames):
            return True
        f = f.f_back
    return False
