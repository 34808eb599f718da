"""``st.unsafe()``: the marking of call sites where ``unsafe=True`` kernels may be launched."""
from __future__ import annotations

import contextlib
import contextvars
import inspect
import sys

from ..errors import UnsafeError

# The open `with st.unsafe():` blocks of this context, each naming the frame whose code runs
# inside it (until the block ends: a context copied meanwhile keeps no frame alive). A launch is marked when one of those frames is on its call stack: the
# block's own code and what it calls, never code that merely shares the context (a caller
# resuming a generator suspended inside a block, a task, thread or callback started from one),
# so the marking ends where the block does. Each block removes exactly its own entry, in
# whatever order blocks close and in whichever context.
_open: contextvars.ContextVar = contextvars.ContextVar("safetile_unsafe", default=())


class _Block:
    __slots__ = ("frame",)

    def __init__(self, frame):
        self.frame = frame


def _body_frame(frame):
    """The frame that runs a block entered from ``frame``: past contextlib's own frames, and
    past a generator-based context manager whose ``with`` body is its caller's."""
    if frame.f_code.co_flags & inspect.CO_GENERATOR and frame.f_back is not None and \
            frame.f_back.f_code.co_filename == contextlib.__file__:
        frame = frame.f_back
    while frame.f_back is not None and frame.f_code.co_filename == contextlib.__file__:
        frame = frame.f_back
    return frame


_SPELLING = ("write `with st.unsafe():` around the launch, or `@st.unsafe()` over a "
             "function, with the parentheses; an unsafe kernel itself is defined with "
             "@st.kernel(unsafe=True)")


class _UnsafeType(type):
    # `with st.unsafe:` (the class, not a block) would fail with Python's "does not support
    # the context manager protocol", which names neither safetile nor the fix.
    def __enter__(cls):
        raise UnsafeError(f"`with st.unsafe:` opens no block: {_SPELLING}")

    def __exit__(cls, *exc):
        return False


class unsafe(contextlib.ContextDecorator, metaclass=_UnsafeType):
    """Marks the call sites where ``unsafe=True`` kernels may be launched (a ``with`` block, or
    a decorator marking a whole function)."""

    def __init__(self, *args, **kwargs):
        if args or kwargs:              # `@st.unsafe` without parentheses, or options
            raise UnsafeError(f"st.unsafe() takes no arguments: {_SPELLING}")

    def _recreate_cm(self):
        return unsafe()                   # a decorated function's calls may nest

    def __enter__(self):
        return self._open_at(_body_frame(sys._getframe(1)))

    def _open_at(self, frame):
        # One object may be entered again while open (nested, or by several threads): each
        # entry is a block of its own, and each exit closes the newest one this object
        # opened for the code that exits it (the frame its body runs in).
        block = _Block(frame)
        self.__dict__.setdefault("_blocks", []).append(block)
        _open.set(_open.get() + (block,))
        return self

    def __exit__(self, *exc):
        blocks, frame = self._blocks, _body_frame(sys._getframe(1))
        block = next((b for b in reversed(blocks) if b.frame is frame), blocks[-1])
        blocks.remove(block)
        block.frame = None                # inert in every context that copied it
        _open.set(tuple(b for b in _open.get() if b is not block))
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
    blocks = _open.get()
    if not blocks:
        return False
    frames = [b.frame for b in blocks if b.frame is not None]
    f = sys._getframe(1)
    while f is not None:
        if any(f is g for g in frames):
            return True
        f = f.f_back
    return False
