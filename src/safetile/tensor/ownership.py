"""Ownership states of host handles (Tensor, Partition, Shared).

cuTile Rust gets move semantics from rustc. safetile enforces them at run time: every host
value is a *handle* in one of three states:

``live``
    usable; every public method and property works.
``moved``
    handed to something else (a Partition, a Shared value, an in-flight operation, torch via
    ``into_torch``). Any use raises :class:`~safetile.errors.MovedError` naming where it went
    and what to do to get it back. The receiver may bring the same handle back with
    :meth:`Handle._restore` (an operation does this when it is synchronized).
``released``
    ended for good (``Shared.release()``, ``Shared.try_unwrap()``); never comes back.

Invariants:

* Every state change happens under the one process-wide :data:`LOCK`, so two threads can
  never both move one handle: exactly one ``_move`` wins, the others raise ``MovedError``.
* Reading the state (``_check``) takes no lock: reading one attribute is atomic in CPython,
  and a handle that is live when checked may only become moved by an explicit ``_move``
  (which *does* lock and re-checks). This keeps ``_check`` cheap on the launch hot path.
"""
from __future__ import annotations

import sys
import threading
import traceback
from typing import NoReturn

from ..errors import ArgumentError, CopyError, ExecutionError, MovedError

__all__ = ["LOCK", "Handle", "LIVE", "MOVED", "RELEASED", "restore_all_locked",
           "finalize", "run_finalizers", "QUEUED_FINALIZERS", "WALK", "walk"]

#: Guards every ownership state change and the borrow registry (re-entrant: a state change
#: may call another one, e.g. ``Shared.try_partition`` unwraps then partitions).
LOCK = threading.RLock()

# A finalizer (``__del__``) may run inside any allocation: a garbage collection can start in
# the middle of a walk over the borrow registries on this thread, and LOCK, re-entrant, would
# let the finalizer's release change the holds under that walk (skipping the hold that
# conflicts). So the walks count themselves (``Walk``), a finalizer that runs inside one
# queues its work here, and the outermost walk runs the queue as it ends.
QUEUED_FINALIZERS: list = []


class Walk:
    """The walks over the borrow registries in progress, counted in ``depth`` (changed under
    LOCK, so only by the thread that holds it). A walk is written out where it happens::

        with LOCK:
            WALK.depth += 1
            try:
                ...
            finally:
                WALK.depth -= 1
                if QUEUED_FINALIZERS and not WALK.depth:
                    run_finalizers()

    (or ``walk(fn)``): no call stands between taking LOCK and counting the walk, or between
    uncounting it and letting LOCK go, so an interrupt (raised where Python checks for
    signals: at calls and loop jumps) cannot leave LOCK held or the count off, as a Python
    ``__enter__``/``__exit__`` cut short there would."""

    __slots__ = ("depth",)

    def __init__(self):
        self.depth = 0

    def here(self) -> bool:
        """True in code that runs inside a walk of this thread: a finalizer, or a weakref or
        gc callback, that a collection started in the middle of one."""
        return bool(self.depth) and LOCK._is_owned()


WALK = Walk()


def walk(fn):
    """``fn()`` inside a walk (see ``Walk``), and its result."""
    with LOCK:
        WALK.depth += 1
        try:
            return fn()
        finally:
            WALK.depth -= 1
            if QUEUED_FINALIZERS and not WALK.depth:
                run_finalizers()


def refuse_inside_walk(what: str) -> None:
    """Raise ``ExecutionError`` if this thread is inside a walk over the registries: the code
    running is a finalizer (``__del__``) or a weakref or gc callback that a collection started
    in the middle of a borrow check or registration, which has the registries half-updated.
    A borrow checked or taken then could miss a conflicting one, or be missed by that walk."""
    if WALK.here():
        raise ExecutionError(
            f"cannot {what}: this runs inside a borrow check of this thread (a finalizer, "
            f"__del__, or a weakref or gc callback that a garbage collection started in the "
            f"middle of one), which has safetile's borrows or views half-updated; launch, share, "
            f"view and read safetile values outside finalizers (e.g. hand the work to a queue "
            f"there)")


def finalize(work) -> None:
    """Run a finalizer's ``work()`` now, or queue it if this thread is inside a walk."""
    if WALK.here():
        QUEUED_FINALIZERS.append(work)
    else:
        work()


def run_finalizers() -> None:
    """Run the queued finalizer work (not inside a walk). A failure is reported as Python
    reports one in ``__del__`` (on stderr) and the rest still runs."""
    while QUEUED_FINALIZERS and not WALK.here():
        try:
            work = QUEUED_FINALIZERS.pop(0)
        except IndexError:                    # another thread took the last one
            return
        try:
            work()
        except BaseException as e:            # as an exception raised in __del__ is
            try:
                print(f"Exception ignored in a finalizer of {work!r}:", file=sys.stderr)
                traceback.print_exception(e, file=sys.stderr)
            except BaseException:             # no stderr to report on (closed, a broken pipe)
                pass

LIVE = "live"
MOVED = "moved"
RELEASED = "released"

_DEFAULT_HINT = "use the value it hands back (the results of op.sync() or await op)"


class NoCopies:
    """``copy``, ``deepcopy`` and ``pickle`` refuse (``_refuse_copy`` says why): a copy of
    a handle or an operation would be an owner that the ownership rules do not count."""

    __slots__ = ()

    def _refuse_copy(self, how: str):
        raise NotImplementedError

    def __copy__(self):
        self._refuse_copy("copied")

    def __deepcopy__(self, memo):
        self._refuse_copy("deep-copied")

    def __reduce_ex__(self, protocol):
        self._refuse_copy("pickled")


class Handle(NoCopies):
    """Base class of host handles with a live / moved / released state.

    Subclasses implement :meth:`_describe` (a short description such as
    ``Tensor(shape=(1024,), float32)``) and call :meth:`_check` first in every public method
    and property.
    """

    # _state: one of LIVE, MOVED, RELEASED.
    # _moved_to: where the value went ("Partition(...)", "kernel 'add' (f.py:12), argument
    #            'z'"), None while live.
    # _hint: what the user should do to get the value back, None while live.
    __slots__ = ("_state", "_moved_to", "_hint", "__weakref__")

    def __init__(self) -> None:
        self._state = LIVE
        self._moved_to: str | None = None
        self._hint: str | None = None

    # -- torch functions given a handle ------------------------------------------------------
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None) -> NoReturn:
        # Without this, torch reports "must be Tensor, not Tensor": both classes have one name.
        # A handle is not a torch.Tensor, and its storage is not handed to torch: a copy is.
        name = getattr(func, "__name__", str(func)).strip("_")
        what = f"torch function {name}()" if func else "host arithmetic (+, -, *, <, ...)"
        out = ".unpartition().to_torch()" if cls.__name__ == "Partition" else ".to_torch()"
        raise ArgumentError(
            f"{what} was given an st.{cls.__name__}, safetile's handle, not a torch.Tensor: "
            f"take a torch copy with {out}, or compute on it in a kernel")

    def _no_host_arithmetic(self, *_) -> NoReturn:
        # torch's own operators turn the TypeError of __torch_function__ into NotImplemented
        # and land here, so `torch_tensor + handle` says the same as `torch.add`
        type(self).__torch_function__(None, ())

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _no_host_arithmetic
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = _no_host_arithmetic
    __matmul__ = __rmatmul__ = __pow__ = __rpow__ = __mod__ = __rmod__ = _no_host_arithmetic
    __neg__ = __pos__ = __abs__ = __invert__ = _no_host_arithmetic
    __lt__ = __le__ = __gt__ = __ge__ = _no_host_arithmetic

    def _no_host_value(self, *_) -> NoReturn:
        # a handle's data lives on its device: no truth value, length or number without a copy
        out = ".unpartition().to_torch()" if type(self).__name__ == "Partition" else ".to_torch()"
        raise ArgumentError(
            f"an st.{type(self).__name__} has no host value (truth, len, int or float): read "
            f"its .shape, take a torch copy with {out}, or compute on it in a kernel")

    __bool__ = __len__ = __float__ = __int__ = __index__ = __complex__ = _no_host_value

    def __array__(self, *_, **__) -> NoReturn:
        # without it numpy wraps the handle in a 0-d object array and says nothing
        out = ".unpartition().numpy()" if type(self).__name__ == "Partition" else ".numpy()"
        raise ArgumentError(
            f"numpy was given an st.{type(self).__name__}, safetile's handle, not an array: "
            f"take a numpy copy with {out}")

    # -- to be provided by subclasses -------------------------------------------------------
    def _describe(self) -> str:
        """A short description used in messages; must not call ``_check``."""
        return type(self).__name__

    # -- no copies (a Shared copy would let try_unwrap succeed while it lives; a Tensor copy
    # would own storage twice) -----------------------------------------------------------------
    _COPY_HINT = "a handle has one owner"

    def _refuse_copy(self, how: str):
        raise CopyError(f"{self._describe()} cannot be {how}: {self._COPY_HINT}")

    # -- state queries / changes --------------------------------------------------------------
    def _is_live(self) -> bool:
        """True while the handle is usable (no exception, no lock)."""
        return self._state is LIVE

    def _moved_message(self, action: str) -> str:
        if self._state is RELEASED:
            return (f"cannot {action}: {self._describe()} was released by {self._moved_to}; "
                    f"{self._hint}")
        return (f"cannot {action}: {self._describe()} was moved into {self._moved_to}; "
                f"{self._hint}")

    def _check(self, action: str = "use it") -> None:
        """Raise :class:`MovedError` unless the handle is live.

        ``action`` completes the sentence "cannot ...", e.g. ``"read .shape"``.
        """
        if self._state is not LIVE:
            raise MovedError(self._moved_message(action))

    def _move(self, where: str, hint: str | None = None) -> None:
        """Atomically check that the handle is live and mark it moved into ``where``.

        ``where`` completes "was moved into ...", e.g. ``"kernel 'add' (examples/01.py:12),
        argument 'z'"``; ``hint`` says how to get the value back (a default is given).
        Raises :class:`MovedError` if the handle is not live (e.g. moved twice).
        """
        with LOCK:
            self._move_locked(where, hint)

    def _move_locked(self, where: str, hint: str | None = None) -> None:
        """``_move`` for a caller that already holds ``LOCK`` (the launcher moves all the
        arguments of one launch under one acquisition)."""
        if self._state is not LIVE:
            raise MovedError(self._moved_message(f"move it into {where}"))
        self._state = MOVED
        self._moved_to = where
        self._hint = hint or _DEFAULT_HINT

    def _restore(self) -> None:
        """Mark a moved handle live again (the receiver hands it back).

        Restoring a live handle does nothing; a released handle cannot be restored.
        """
        with LOCK:
            self._restore_locked()

    def _restore_locked(self) -> None:
        """``_restore`` for a caller that already holds ``LOCK``."""
        if self._state is RELEASED:
            raise MovedError(self._moved_message("restore it"))
        self._state = LIVE
        self._moved_to = None
        self._hint = None

    def _release(self, by: str, hint: str) -> None:
        """Mark the handle released for good (caller holds ``LOCK`` and has checked)."""
        self._state = RELEASED
        self._moved_to = by
        self._hint = hint

    def _state_suffix(self) -> str:
        """``""`` while live, else ``", moved into ..."`` / ``", released"`` (for reprs)."""
        if self._state is LIVE:
            return ""
        if self._state is RELEASED:
            return f", released by {self._moved_to}"
        return f", moved into {self._moved_to}"


def restore_all_locked(handles) -> None:
    """Hand back every handle of ``handles`` that is not released (caller holds ``LOCK``).

    The slow path of an operation's hand-back. A handle may have been released meanwhile:
    only a ``Shared`` clone can be, when the operation and the clone are garbage of one
    reference cycle (the collector finalizes them in no particular order, and the clone's
    finalizer releases it); it is skipped. Or an interrupt (``KeyboardInterrupt``) cut the
    hand-back short: the operation hands back once, so a handle it skipped would stay moved
    for good; each one comes back even if another interrupt lands meanwhile, and the first
    is raised once all are back. Restoring a handle already back is harmless: under ``LOCK``
    nothing else can have moved it again."""
    interrupted = None
    for h in handles:
        while True:
            try:
                if h._state is not RELEASED:
                    h._restore_locked()
                break
            except BaseException as e:
                interrupted = interrupted or e
                if isinstance(e, Exception):      # no interrupt: it would fail again
                    break
    if interrupted is not None:
        raise interrupted
