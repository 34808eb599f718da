"""``st.unsafe()``: the marking of call sites where ``unsafe=True`` kernels may be launched."""
from __future__ import annotations

import contextlib
import contextvars

# How many `with st.unsafe():` blocks are open in this context (a context variable, so that
# an awaited op run on another thread keeps the marking of the code that awaited it).
_unsafe_depth: contextvars.ContextVar = contextvars.ContextVar("safetile_unsafe", default=0)


@contextlib.contextmanager
def unsafe():
    """Marks the call sites where ``unsafe=True`` kernels may be launched."""
    token = _unsafe_depth.set(_unsafe_depth.get() + 1)
    try:
        yield
    finally:
        _unsafe_depth.reset(token)


def in_unsafe_block() -> bool:
    """Whether a ``with st.unsafe():`` block is open in this context."""
    return _unsafe_depth.get() > 0
