"""Decoding ahead: a request's decode chunks run on a worker thread ahead of the reader, so
that the reader's host work (detokenizing, stop strings, the caller's own) runs while the
device decodes the next chunk instead of leaving it idle between chunks.

The worker starts the next chunk as soon as it has handed one over, without waiting for the
reader to take it: a worker woken by the reader would need the interpreter lock while the
reader holds it for its own work, and would launch only once that work is done.

Invariants:

* a chunk runs only while the worker holds the engine's lock, and only if the worker has
  not been stopped (checked under that lock), so no chunk starts after ``stop()``; the
  engine's ``decode`` checks, under the same lock, that its request is still the newest;
* the worker starts a chunk only while at most one decoded chunk is unread, so a request
  that ends early (an end token, a stop string, ``close()``) has decoded at most two
  chunks more than it read; one that ends by length decodes nothing extra (the worker
  stops at its budget);
* ``stop()`` returns once no chunk of this worker is running (unless called on the worker
  itself): the device state is the engine's again when a stream's ``close()`` returns;
* an error raised by a chunk reaches the reader in that chunk's place.
"""
from __future__ import annotations

import atexit
import contextvars
import threading
import weakref
from collections import deque
from typing import Callable

__all__ = ["DecodeAhead"]

_LIVE: "weakref.WeakSet[DecodeAhead]" = weakref.WeakSet()


class DecodeAhead:
    """The chunks ``decode(budget)`` returns (lists of at least one item), run on a worker
    thread until ``budget`` items have been decoded or it is stopped.

    ``decode(remaining)`` runs one chunk of at most ``remaining`` items; it is called with
    ``lock`` held. The worker starts at once, in a copy of the caller's context
    (``st.backend`` and the like)."""

    def __init__(self, decode: Callable[[int], list], budget: int, lock):
        self._decode, self._budget, self._lock = decode, budget, lock
        self._cond = threading.Condition()
        self._ready: deque = deque()      # decoded chunks (or one error) not yet read
        self._stopped = False
        self._in_chunk = False
        self._done = False                # the worker has returned
        ctx = contextvars.copy_context()
        self._thread = threading.Thread(target=ctx.run, args=(self._work,), daemon=True,
                                        name="grout-decode-ahead")
        _LIVE.add(self)
        self._thread.start()

    def next_chunk(self) -> list:
        """The next decoded chunk (waiting for it); raises the error that ended the worker,
        or ``RuntimeError`` when asked past the budget or after ``stop()``."""
        with self._cond:
            while not self._ready:
                if self._done or self._stopped:
                    raise RuntimeError("no chunk is left to decode: the budget is spent "
                                       "or decoding was stopped")
                self._cond.wait()
            item = self._ready.popleft()
            self._cond.notify_all()
        if isinstance(item, BaseException):
            raise item
        return item

    def stop(self) -> None:
        """Decode nothing more; return once no chunk is running (see the module docstring)."""
        with self._cond:
            self._stopped = True
            self._ready.clear()
            self._cond.notify_all()
            if threading.current_thread() is not self._thread:
                while self._in_chunk:
                    self._cond.wait()

    # -- the worker ------------------------------------------------------------------------
    def _work(self) -> None:
        remaining = self._budget
        try:
            while remaining > 0:
                with self._cond:              # at most one chunk left unread
                    while len(self._ready) > 1 and not self._stopped:
                        self._cond.wait()
                with self._lock:
                    with self._cond:
                        if self._stopped:
                            return
                        self._in_chunk = True
                    try:
                        chunk = self._decode(remaining)
                    finally:
                        with self._cond:
                            self._in_chunk = False
                            self._cond.notify_all()
                if not chunk:
                    raise RuntimeError("a decode chunk came back empty")
                remaining -= len(chunk)
                self._hand(chunk)
        except BaseException as e:            # delivered to the reader
            self._hand(e)
        finally:
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def _hand(self, item) -> None:
        """Queue ``item`` for the reader (dropped once stopped)."""
        with self._cond:
            if not self._stopped:
                self._ready.append(item)
                self._cond.notify_all()


@atexit.register
def _stop_all() -> None:
    """At exit, let no worker be inside a chunk while the interpreter shuts down."""
    for ahead in list(_LIVE):
        ahead.stop()
