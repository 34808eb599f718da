"""``Shared``: a read-only, cloneable handle to a tensor (Rust's ``Arc<Tensor>``).

``t.share()`` consumes ``t``; ``s.clone()`` makes more handles. All handles of one shared
value point at one :class:`_SharedCore` that holds the (moved) Tensor and counts

* ``handles``: handles not yet released (including those moved into in-flight operations),
* ``in_flight``: for each handle currently moved into an operation, where it went.

Several operations may read one shared value at the same time (each gets its own clone).
The value becomes mutable again only through ``try_unwrap()`` / ``try_partition()``, which
succeed only for the last live handle when no in-flight operation holds the value or any
bytes of it. A dropped handle releases itself (``__del__``), so forgotten clones don't block.

Invariant: ``core.handles == number of handles whose state is not RELEASED``, maintained
under ``LOCK`` by ``clone`` (+1), ``release`` / ``__del__`` / ``try_unwrap`` (-1).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .. import dtypes as _dtypes
from ..errors import ArgumentError, BorrowError, HeldInFlightError
from . import borrows
from .ownership import LIVE, LOCK, MOVED, RELEASED, Handle, finalize
from .tensor import _to_numpy, host_read

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from .partition import Partition
    from .tensor import Tensor

__all__ = ["Shared"]

class _TensorOnly:
    """A Tensor method a Shared value lacks: reading it says how to get at the Tensor."""

    # A class-level descriptor rather than ``Shared.__getattr__``: on Python 3.11 a class with
    # ``__getattr__`` loses the specialized lookup of every other attribute, and each launch
    # reads a Shared argument's attributes several times.
    __slots__ = ("name", "hint")

    def __init__(self, hint: str | None = None):
        self.hint = hint

    def __set_name__(self, owner, name: str) -> None:
        self.name = name
        if self.hint is None:
            self.hint = (f"take the Tensor back with .try_unwrap() once no other handle holds "
                         f"it, then call .{name}() on it; .to_torch() gives a copy of the data "
                         f"meanwhile")

    def __get__(self, shared, owner=None):
        if shared is None:
            return self
        # obj=None: Python's "Did you mean" must not point at the private ``_core``
        raise AttributeError(f"'Shared' object has no attribute '{self.name}': {self.hint}",
                             name=self.name, obj=None)


class _SharedCore:
    """State common to all handles of one shared value (guarded by ``LOCK``)."""

    __slots__ = ("tensor", "handles", "in_flight", "hold")

    def __init__(self, tensor: "Tensor", hold):
        self.tensor = tensor                    # moved into this shared value
        self.handles = 1
        self.in_flight: dict[int, str] = {}     # id(handle) -> where it went
        # A read borrow of the storage for the value's whole life: views made before
        # share() (or a graph that recorded one) cannot write it while it is shared.
        self.hold = hold


class Shared(Handle):
    """A read-only handle to a shared tensor; pass it as an ``st.In`` argument.

    Raises :class:`~safetile.errors.MovedError` while this handle is moved into an
    operation, and after ``release()`` / ``try_unwrap()`` / ``try_partition()``; those two
    raise :class:`~safetile.errors.BorrowError` while any in-flight operation holds the
    value, this very handle included (then a ``HeldInFlightError``, both at once).
    """

    __slots__ = ("_core",)
    _COPY_HINT = "make another counted read handle with shared.clone()"

    def __init__(self, *args, **kwargs):
        raise ArgumentError("make a Shared value with tensor.share()")

    @classmethod
    def _create(cls, tensor: "Tensor", hold) -> "Shared":
        return cls._new_handle(_SharedCore(tensor, hold))

    @classmethod
    def _new_handle(cls, core: _SharedCore, state=LIVE) -> "Shared":
        self = object.__new__(cls)
        Handle.__init__(self)
        self._core = core
        self._state = state
        return self

    # -- for the launcher -------------------------------------------------------------------
    @property
    def _tensor(self) -> "Tensor":
        """The shared Tensor (moved state; no check)."""
        return self._core.tensor

    @property
    def _torch(self) -> "torch.Tensor":
        """The shared torch tensor (no check)."""
        return self._core.tensor._torch

    def _move_locked(self, where: str, hint: str | None = None) -> None:
        """Move this handle into an operation; it stays counted and is marked in flight."""
        Handle._move_locked(self, where, hint)
        self._core.in_flight[id(self)] = where

    def _restore_locked(self) -> None:
        """The operation hands this same handle back."""
        Handle._restore_locked(self)
        self._core.in_flight.pop(id(self), None)

    # -- description ----------------------------------------------------------------------
    def _describe(self) -> str:
        t = self._core.tensor._torch
        return f"Shared(shape={tuple(t.shape)}, {_dtypes.from_torch(t.dtype).name})"

    def __repr__(self) -> str:
        t = self._core.tensor._torch
        return (f"Shared(shape={tuple(t.shape)}, dtype={_dtypes.from_torch(t.dtype)!r}, "
                f"device={t.device}, handles={self._core.handles}{self._state_suffix()})")

    # -- properties ------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        """The shape, a tuple of ints."""
        self._check("read .shape")
        return tuple(self._core.tensor._torch.shape)

    @property
    def dtype(self) -> _dtypes.DType:
        """The safetile element type."""
        self._check("read .dtype")
        return _dtypes.from_torch(self._core.tensor._torch.dtype)

    @property
    def device(self) -> "torch.device":
        """The torch device holding the data."""
        self._check("read .device")
        return self._core.tensor._torch.device

    @property
    def numel(self) -> int:
        """The number of elements."""
        self._check("read .numel")
        return self._core.tensor._torch.numel()

    @property
    def ndim(self) -> int:
        """The rank."""
        self._check("read .ndim")
        return self._core.tensor._torch.dim()

    @property
    def num_handles(self) -> int:
        """How many handles of this value are not released (this one included)."""
        self._check("read .num_handles")
        return self._core.handles

    def to_torch(self) -> "torch.Tensor":
        """A *copy* of the data as a torch tensor on the same device (for inspection)."""
        self._check("call .to_torch()")
        t = self._core.tensor._torch
        with host_read(t, self._describe(), "to_torch()"):
            return t.clone()

    def numpy(self):
        """A *copy* of the data as a numpy array (bfloat16 comes back as float32)."""
        self._check("call .numpy()")
        with host_read(self._core.tensor._torch, self._describe(), "numpy()"):
            return _to_numpy(self._core.tensor._torch)

    # One descriptor per Tensor method (each learns its name from __set_name__).
    into_torch, view, reshape, slice, stride, is_contiguous = (_TensorOnly() for _ in range(6))
    partition = _TensorOnly("a Shared value is read-only; take it back as a Partition with "
                            ".try_partition(tile_shape) once no other handle holds it")
    share = _TensorOnly("it is shared already; .clone() makes another read handle")

    # -- handles ---------------------------------------------------------------------------
    def clone(self) -> "Shared":
        """Another read-only handle to the same value."""
        with LOCK:
            self._check("clone it")
            core = self._core
            # Built released, so that one dropped before it is counted (an interrupt landing
            # as it is built) ends nothing; no call between the count and the state, so an
            # interrupt finds both done or neither.
            clone = Shared._new_handle(core, RELEASED)
            core.handles += 1
            clone._state = LIVE
            return clone

    def release(self) -> None:
        """End this handle now (dropping the last reference does the same)."""
        with LOCK:
            self._check("release it")
            self._end("release()", "use another handle of the shared value (clone before "
                                   "releasing)")

    def _end(self, by: str, hint: str) -> None:
        """Mark this handle released and count one handle fewer; the last one ends the
        value's read borrow (caller holds LOCK). Past the mark the only call is the hold's
        release, idempotent: one an interrupt cuts short (at its entry) runs again, so the
        count and the borrow never disagree."""
        self._release(by, hint)
        core = self._core                         # (no call between the mark and the count)
        core.handles -= 1
        if core.handles:
            return
        interrupted = None
        while True:
            try:
                core.hold.release()
                break
            except Exception:
                raise
            except BaseException as e:
                interrupted = interrupted or e
        if interrupted is not None:
            raise interrupted

    def __del__(self):
        finalize(self._finalize)

    def _finalize(self) -> None:
        # A dropped handle must not block try_unwrap forever. Never raise from __del__.
        try:
            with LOCK:
                if self._state is not RELEASED:
                    self._core.in_flight.pop(id(self), None)
                    self._end("its collection", "")
        except Exception:  # pragma: no cover - interpreter shutdown, half-built handle
            pass

    def _check_not_held(self, action: str) -> None:
        """``_check`` for try_unwrap / try_partition: a handle moved into an operation is
        held by that in-flight operation, which a BorrowError reports for every other
        holder, so it is one here too (and still a MovedError: the handle is moved)."""
        if self._state is MOVED:
            raise HeldInFlightError(self._moved_message(action))
        self._check(action)

    def _sole_owner_or_raise(self, action: str) -> None:
        """Raise BorrowError unless this is the only handle and nothing in flight holds the
        value (caller holds LOCK and has checked this handle is live)."""
        core = self._core
        others = core.handles - 1
        if others > 0:
            busy = list(core.in_flight.values())
            idle = others - len(busy)
            parts = []
            if idle:
                parts.append(f"{idle} idle clone{'s' if idle != 1 else ''}")
            if busy:
                parts.append(f"{len(busy)} held by in-flight operation"
                             f"{'s' if len(busy) != 1 else ''}: " + "; ".join(busy))
            todo = []
            if busy:
                todo.append("synchronize those operations (op.sync() or await op)")
            if idle:
                todo.append("release the other clones (h.release() or drop them)")
            raise BorrowError(
                f"cannot {action} {self._describe()}: {others} other handle"
                f"{'s are' if others != 1 else ' is'} alive ({', '.join(parts)}); "
                f"{' and '.join(todo)} first")
        # Zero-copy views made before share() are separate handles: check the bytes too,
        # this value's own read borrow set aside. That borrow stays registered until the
        # check has passed (``_unwrap_locked`` ends it): a value that stays shared keeps its
        # bytes read-only, and the graph that may rewrite it (``borrows.collect_shared``)
        # knows it by that very hold.
        borrows.check_host_write(core.tensor._torch, f"{action} {self._describe()}",
                                 exempt=core.hold, touches_bytes=False)

    def try_unwrap(self) -> "Tensor":
        """The Tensor back, if this is the last handle and nothing in flight holds it.

        Raises :class:`~safetile.errors.BorrowError` naming the other holders otherwise.
        Consumes this handle on success.
        """
        with LOCK:
            self._check_not_held("call .try_unwrap()")
            self._sole_owner_or_raise("unwrap")
            return self._unwrap_locked("try_unwrap()", "use the Tensor try_unwrap() returned")

    def _unwrap_locked(self, by: str, hint: str) -> "Tensor":
        """Consume the last handle (``_sole_owner_or_raise`` passed, under the same LOCK)."""
        # The Tensor first (idempotent; it stays out of reach until this returns): an
        # interrupt before the handle ends leaves the value shared, to unwrap again.
        tensor = self._core.tensor
        tensor._restore_locked()
        try:
            self._end(by, hint)                 # the last one: ends the value's read borrow
        except BaseException as e:              # (an interrupt) past the mark: the Tensor
            if self._state is RELEASED:         # is the caller's, carried by the error
                e.recovered = tensor
            raise
        return tensor

    def try_partition(self, tile_shape, order: str = "row_major", group_size: int = 8,
                      persistent: int | None = None) -> "Partition":
        """Like ``self.try_unwrap().partition(tile_shape, ...)``, atomically; the partition
        arguments are validated first, so a bad tile shape consumes nothing."""
        from .partition import _validate
        self._check_not_held("call .try_partition()")
        # Read as plain values before the checks: the tile shape's ints run their own
        # __index__, which could release or clone this very handle between the count of the
        # handles and the unwrap. The checks and the partition below then run no user code.
        tiles, po = _validate(tuple(self._core.tensor._torch.shape), tile_shape, order,
                              group_size, persistent)
        with LOCK:
            self._check_not_held("call .try_partition()")
            self._sole_owner_or_raise("partition")
            tensor = self._unwrap_locked("try_partition()",
                                         "use the Partition try_partition() returned")
            try:
                return tensor.partition(tiles, order=po.kind, group_size=po.group_size,
                                        persistent=po.persistent)
            except BaseException as e:          # (an interrupt): the value is the caller's
                if getattr(e, "recovered", None) is None and tensor._is_live():
                    e.recovered = tensor
                raise
