"""``Tensor``: an owned, movable handle to a torch tensor.

A Tensor owns its storage (see ``alloc.from_torch`` for what "owns" means when user code
keeps its own torch reference). It can be

* moved: into a :class:`~safetile.tensor.partition.Partition` (``partition``), into a
  :class:`~safetile.tensor.shared.Shared` value (``share``), into an operation (the
  launcher calls ``_move``), or out to torch (``into_torch``);
* viewed: ``view``, ``reshape``, ``slice`` and ``t[...]`` return new Tensors over the same
  bytes without consuming ``t``. Views are separate handles; the borrow registry
  (``borrows.py``) stops an operation from writing bytes another in-flight operation uses,
  and stops the host from reading bytes an in-flight operation writes. ``into_torch`` hands
  bytes to torch only while no other live handle of the same family (the tensor, its views,
  theirs) reaches them.

The launcher reads the wrapped torch tensor from ``self._torch`` directly.
"""
from __future__ import annotations

import operator
import weakref
from typing import TYPE_CHECKING

import torch

from ..errors import ArgumentError, BorrowError, IndexOutOfRangeError
from .. import dtypes as _dtypes
from . import borrows, replayed
from .overlap import overlaps, past_storage
from .ownership import LOCK, Handle, refuse_inside_walk, walk
from .partition import Partition, _validate

if TYPE_CHECKING:  # pragma: no cover
    from .shared import Shared

__all__ = ["Tensor"]


def _shape_tuple(shape, what: str = "shape") -> tuple[int, ...]:
    """Normalize an int or a sequence of ints to a tuple of ints (TypeError otherwise)."""
    if not isinstance(shape, bool):
        try:
            shape = (operator.index(shape),)           # one int (numpy's too)
        except TypeError:
            pass
    try:
        dims = tuple(operator.index(d) for d in shape)
    except TypeError:
        raise ArgumentError(f"{what} must be an int or a sequence of ints, got {shape!r}") from None
    if any(isinstance(d, bool) for d in shape):
        raise ArgumentError(f"{what} must be ints, got {shape!r}")
    return dims


def as_index(v, what: str) -> int:
    """``v`` as an int (numpy and 0-d torch ints too, never a bool) for an error naming
    ``what``."""
    try:
        if isinstance(v, bool):
            raise TypeError
        return operator.index(v)
    except TypeError:
        raise ArgumentError(f"{what} must be an int, got {type(v).__name__} {v!r}") from None


def _checked_slice(s: slice, what: str) -> slice:
    """``s`` with int (or None) bounds and a positive int step (1 when None)."""
    start = None if s.start is None else as_index(s.start, f"{what}: a slice start")
    stop = None if s.stop is None else as_index(s.stop, f"{what}: a slice stop")
    step = 1 if s.step is None else as_index(s.step, f"{what}: a slice step")
    if step <= 0:
        raise ArgumentError(f"{what}: slice step must be a positive int, got {step}")
    return slice(start, stop, step)


def _to_numpy(t: torch.Tensor):
    """A host numpy copy of ``t`` (bfloat16, which numpy lacks, is upcast to float32)."""
    src = t.detach()
    t = src.float() if src.dtype == torch.bfloat16 else src    # exact upcast, a copy
    t = t.cpu()                                                 # a copy unless on the host
    if t is src:
        t = t.clone()            # never hand out a numpy alias of owned storage
    return t.numpy()


def within_storage(t: torch.Tensor, what: str) -> None:
    """Raise ``ArgumentError`` if ``t`` reaches past the end of its storage (shrunk through a
    torch alias since the handle was made): reading, writing or exporting it would touch
    memory past the storage's block. ``what`` completes "cannot ..."."""
    if past_storage(t):
        raise ArgumentError(f"cannot {what}: it reaches past the end of its storage, which was "
                            f"shrunk through a torch alias; make the tensor again")


def host_read(t: torch.Tensor, described: str, how: str):
    """The checks of a host copy of ``t`` (the handle ``described``) with ``how``, and its read
    borrow while it copies (``borrows.host_read``)."""
    within_storage(t, f"read {described} with {how}")
    replayed.check_no_recorded_write(t, f"read {described} with {how}")
    return borrows.host_read(t, f"read {described} with {how}")


def _plain(t: torch.Tensor) -> torch.Tensor:
    """``t`` (a torch.Tensor subclass) as a plain ``torch.Tensor`` over the same storage.
    ``torch.Tensor.as_subclass`` is torch's own method, not one the subclass overrides; a
    subclass whose torch dispatch keeps its type (a fake or wrapper tensor) is refused."""
    try:
        plain = torch.Tensor.as_subclass(t, torch.Tensor)
    except Exception as e:
        plain, why = None, f" ({type(e).__name__}: {e})"
    else:
        why = ""
    if type(plain) is not torch.Tensor:
        raise ArgumentError(
            f"a {type(t).__name__} (a torch.Tensor subclass) could not be viewed as a plain "
            f"torch.Tensor over its memory{why}; pass a plain torch.Tensor")
    return plain


class Tensor(Handle):
    """A dense n-dimensional array on one device, owned by safetile.

    Create one with ``st.zeros / ones / full / empty / arange / randn``, ``st.from_torch``,
    ``st.from_numpy`` or ``st.from_dlpack``. Every method and property raises
    :class:`~safetile.errors.MovedError` once the tensor was moved (partitioned, shared,
    given to an operation, or turned into a torch tensor with ``into_torch``).
    """

    # _views: the handles made from this one by view/slice/indexing and from each other (a
    # weak set shared by all of them; None until the first view), so that into_torch can
    # refuse while another safetile handle still reaches the bytes it hands to torch.
    __slots__ = ("_torch", "_views")
    _COPY_HINT = ("a Tensor owns its storage: copy the data with st.from_torch(t.to_torch()), "
                  "or make a zero-copy view with t.view(...) / t.slice(...)")

    def __init__(self, *args, **kwargs):
        raise ArgumentError("st.Tensor is not constructed directly: use st.zeros/empty/randn/..., "
                        "st.from_torch(t), st.from_numpy(a) or st.from_dlpack(x)")

    @classmethod
    def _wrap(cls, t: torch.Tensor) -> "Tensor":
        """Internal constructor: wrap ``t`` zero-copy (dtype must be a safetile dtype).

        The wrapped tensor is always a plain, dense ``torch.Tensor`` with memory behind it
        (views too: they are wrapped here): the overlap checks read its address, strides and
        storage, and a subclass could override those methods (report another address, say)
        to slip an overlap past them."""
        if not isinstance(t, torch.Tensor):
            raise ArgumentError(f"expected a torch.Tensor, got {type(t).__name__}")
        if type(t) is not torch.Tensor:
            t = _plain(t)
        if t.layout != torch.strided or t.is_nested:
            layout = "a nested tensor" if t.is_nested else str(t.layout)
            raise ArgumentError(f"only strided (dense) torch tensors can be wrapped, got "
                                f"{layout}; make a dense tensor first (t.to_dense(), or one "
                                f"tensor per nested component)")
        if t.device.type == "meta":
            # Every meta tensor reports address 0: there is nothing to run on or to check.
            raise ArgumentError("a tensor on the meta device has no memory for a kernel to read "
                                "or write: allocate it on the CPU or a GPU")
        if t._is_zerotensor():
            # torch's efficient zeros: address 0 and no storage a kernel or a check could use.
            raise ArgumentError("the torch tensor is a ZeroTensor (torch._efficientzerotensor), "
                                "which has no memory behind it: pass torch.zeros(...) instead")
        _dtypes.from_torch(t.dtype)                      # TypeError if unsupported
        if t.is_neg():
            # torch reads such a view's memory negated; a kernel would read and write it raw.
            raise ArgumentError("the torch tensor carries torch's lazy negation bit (a view "
                                "such as c.conj().imag): its memory holds the negated values; "
                                "pass t.resolve_neg() (a copy) instead")
        if t.requires_grad:
            t = t.detach()                               # zero-copy; safetile has no autograd
        self = object.__new__(cls)
        Handle.__init__(self)
        self._torch = t
        self._views = None
        return self

    # -- description ----------------------------------------------------------------------
    def _describe(self) -> str:
        return f"Tensor(shape={tuple(self._torch.shape)}, {_dtypes.from_torch(self._torch.dtype).name})"

    def __repr__(self) -> str:
        t = self._torch
        return (f"Tensor(shape={tuple(t.shape)}, dtype={_dtypes.from_torch(t.dtype)!r}, "
                f"device={t.device}{self._state_suffix()})")

    # -- properties ------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        """The shape, a tuple of ints."""
        self._check("read .shape")
        return tuple(self._torch.shape)

    @property
    def dtype(self) -> _dtypes.DType:
        """The safetile element type (``st.float32`` ...)."""
        self._check("read .dtype")
        return _dtypes.from_torch(self._torch.dtype)

    @property
    def device(self) -> torch.device:
        """The torch device holding the data."""
        self._check("read .device")
        return self._torch.device

    @property
    def numel(self) -> int:
        """The number of elements."""
        self._check("read .numel")
        return self._torch.numel()

    @property
    def ndim(self) -> int:
        """The rank (number of dimensions)."""
        self._check("read .ndim")
        return self._torch.dim()

    def stride(self) -> tuple[int, ...]:
        """Element strides per dimension (as torch reports them)."""
        self._check("read .stride()")
        return tuple(self._torch.stride())

    def is_contiguous(self) -> bool:
        """Whether the elements are row-major contiguous."""
        self._check("call .is_contiguous()")
        return self._torch.is_contiguous()

    # -- host inspection (copies) ---------------------------------------------------------
    def to_torch(self) -> torch.Tensor:
        """A *copy* of the data as a torch tensor on the same device (for inspection).

        Raises :class:`~safetile.errors.BorrowError` while an in-flight operation writes
        any of these bytes (e.g. through a partition of a tensor this one is a view of).
        """
        self._check("call .to_torch()")
        with self._host_read("to_torch()"):
            return self._torch.clone()

    def numpy(self):
        """A *copy* of the data as a numpy array on the host.

        numpy has no bfloat16: bfloat16 data is returned as float32 (exactly).
        """
        self._check("call .numpy()")
        with self._host_read("numpy()"):
            return _to_numpy(self._torch)

    def _host_read(self, how: str):
        """The checks of a host copy, and its read borrow while it copies."""
        return host_read(self._torch, self._describe(), how)

    # -- moves -------------------------------------------------------------------------------
    def into_torch(self) -> torch.Tensor:
        """Consume the Tensor and return the underlying torch tensor, zero-copy.

        From then on the storage is torch's: safetile no longer checks it. Refused
        (``BorrowError``) while an operation or a live graph's replays use these bytes, an
        open graph scope has recorded a launch that reads or writes them (``replayed.py``), or
        another live handle made by viewing (this tensor, a view, a Partition of one) reaches
        them.
        """
        with LOCK:
            self._check("call .into_torch()")
            borrows.check_host_write(self._torch, f"turn {self._describe()} into torch")
            # In a walk: a finalizer run by a collection during the scans makes no view, and
            # records no graph, that the scans would miss.
            walk(self._hand_to_torch)
        return self._torch

    def _hand_to_torch(self) -> None:
        """into_torch's scans and move (inside a walk: ``ownership.walk``)."""
        what = f"turn {self._describe()} into torch"
        replayed.check_not_replayed(self._torch, what)
        self._refuse_live_views(what)
        if self._views is not None:
            self._views.discard(self)
        self._move("torch by into_torch()",
                   hint="use the torch tensor into_torch() returned "
                        "(st.from_torch(t) wraps it again)")

    def partition(self, tile_shape, order: str = "row_major", group_size: int = 8,
                  persistent: int | None = None) -> "Partition":
        """Consume the tensor and split it into disjoint tiles of ``tile_shape``.

        Every tile dimension must be a positive power of two; tiles need not divide the
        tensor (edge tiles are masked). ``order`` (``"row_major"`` or ``"grouped"``),
        ``group_size`` and ``persistent`` choose the program -> tile map; see
        :class:`~safetile.tensor.partition.ProgramOrder`. ``p.unpartition()`` gives the
        tensor back.
        """
        self._check("call .partition()")
        tiles, prog_order = _validate(tuple(self._torch.shape), tile_shape, order,
                                      group_size, persistent)
        grid = prog_order.grid
        self._move(f"Partition(grid={grid}, tile_shape={tiles}) by .partition()",
                   hint="call .unpartition() on that Partition to get the Tensor back")
        return Partition._create(self, tiles, prog_order)

    def share(self) -> "Shared":
        """Consume the tensor and return a read-only, cloneable :class:`Shared` handle."""
        self._check("share it")
        hold = borrows.hold_shared(self._torch, self._describe())   # AliasError if written
        try:
            # The handle first: an interrupt that lands before the move leaves the tensor
            # live, and the dropped handle ends the borrow too.
            shared = _shared.Shared._create(self, hold)
            self._move("a Shared value by .share()",
                       hint="use the Shared handle share() returned; its .try_unwrap() gives "
                            "the Tensor back once no other handle holds it")
        except BaseException:
            hold.release()
            raise
        return shared

    # -- zero-copy views (do not consume) --------------------------------------------------
    def _derive(self, t: torch.Tensor, action: str) -> "Tensor":
        view = Tensor._wrap(t)
        with LOCK:
            # Checked again where into_torch checks the family (under LOCK): another thread
            # may have handed this tensor to torch since the caller's check, and the view,
            # not yet in the family then, would be a live handle over torch's memory. Nor may
            # it join while into_torch scans the family (from a finalizer a collection ran
            # in the scan): the scan would miss it.
            refuse_inside_walk(action)
            self._check(action)
            family = self._views
            if family is None:
                family = self._views = weakref.WeakSet((self,))
            view._views = family
            family.add(view)
        return view

    def _refuse_live_views(self, what: str) -> None:
        """Raise ``BorrowError`` if another live handle made by viewing (this tensor, its
        views, their Partitions) reaches these bytes: after ``what`` torch owns them, and a
        kernel writing through that handle would write torch's memory unchecked."""
        family = self._views
        if family is None:
            return
        for other in list(family):
            if other is not self and overlaps(other._torch, self._torch):
                raise BorrowError(
                    f"cannot {what}: another safetile handle views these bytes "
                    f"({other._describe()}{other._state_suffix()}), and a launch through it "
                    f"would write memory torch then owns; drop that handle first (del it), or "
                    f"copy the data with to_torch()")

    def view(self, *shape) -> "Tensor":
        """A view with a new shape over the same bytes (``-1`` infers one dim).

        Does not consume the tensor. Raises ``ValueError`` if the layout cannot be viewed
        with that shape without copying.
        """
        self._check("call .view()")
        shp = _shape_tuple(shape[0] if len(shape) == 1 else shape)
        if any(not -2**63 <= d < 2**63 for d in shp):    # torch raises a bare TypeError
            raise ArgumentError(f"cannot view {self._describe()} as {shp}: a dimension is "
                                f"past int64")
        try:
            return self._derive(self._torch.view(shp), "call .view()")
        except RuntimeError as e:
            # (torch's own advice, to call .reshape(), is what copies: it is left out)
            reason = str(e).replace(" Use .reshape(...) instead.", "").rstrip(".")
            raise ArgumentError(
                f"cannot view {self._describe()} (strides {tuple(self._torch.stride())}) as "
                f"shape {shp} without copying: {reason}. Views are zero-copy only; copy "
                f"explicitly with st.from_torch(t.to_torch().reshape(...))") from None

    def reshape(self, *shape) -> "Tensor":
        """Like :meth:`view`: zero-copy only (safetile never copies behind your back)."""
        self._check("call .reshape()")
        return self.view(*shape)

    def slice(self, dim: int, start: int | None = None, stop: int | None = None,
              step: int = 1) -> "Tensor":
        """The elements ``start:stop:step`` along ``dim`` as a zero-copy view (step > 0)."""
        self._check("call .slice()")
        nd = self._torch.dim()
        dim = as_index(dim, "slice: dim")
        if not -nd <= dim < nd:
            raise IndexOutOfRangeError(f"slice: dim {dim} out of range for a rank-{nd} tensor "
                                       f"(dims {-nd} to {nd - 1})")
        part = _checked_slice(slice(start, stop, step), "slice")
        index = (slice(None),) * (dim % nd) + (part,)
        return self._derive(self._torch[index], "call .slice()")

    def __getitem__(self, index) -> "Tensor":
        """Basic indexing (ints, slices with positive step, ``...``) as a zero-copy view."""
        self._check("index it")
        items = index if isinstance(index, tuple) else (index,)
        for it in items:
            if it is Ellipsis or it is None:
                continue
            if isinstance(it, slice):
                _checked_slice(it, "Tensor indexing")
                continue
            # A bool (torch reads it as a mask), a non-int index, or an array of ints (one
            # element passes operator.index) is advanced indexing, which copies: the result
            # would not be a view of these bytes.
            try:
                operator.index(it)
                if isinstance(it, bool) or (isinstance(it, torch.Tensor) and
                                            it.dtype == torch.bool) or getattr(it, "ndim", 0):
                    raise TypeError
            except TypeError:
                raise ArgumentError(
                    f"Tensor indices must be ints, slices or ..., got {type(it).__name__}: "
                    f"advanced indexing would copy; use to_torch() for that") from None
        try:
            view = self._torch[index]
        except (IndexError, ValueError) as e:     # an int past int64 is a ValueError to torch
            raise IndexOutOfRangeError(f"index {index!r} is out of range for "
                                       f"{self._describe()}: {e}") from None
        # torch decides what an index means, not the check above: a 0-d uint8 index is a
        # mask to it, a sequence with __index__ a list of indices; both copy. A handle of a
        # copy would let a launch write bytes that never reach this tensor.
        if view.untyped_storage().data_ptr() != self._torch.untyped_storage().data_ptr():
            raise ArgumentError(
                f"Tensor index {index!r} made torch copy the elements (advanced indexing: a "
                f"uint8 or bool index is a mask, a sequence a list of indices), so the result "
                f"would not be a view of these bytes; index with plain ints and slices, or use "
                f"to_torch() for a copy")
        return self._derive(view, "index it")

    # -- DLPack --------------------------------------------------------------------------
    def __dlpack__(self, stream=None, **kwargs):
        """Export zero-copy through DLPack (``torch.from_dlpack(t)``, ``np.from_dlpack``).

        The consumer gets an alias of storage safetile still owns (outside the guarantee,
        like a torch reference kept after ``st.from_torch``). Raises ``BorrowError`` while
        an in-flight operation uses these bytes, or a graph may replay launches that do, as
        ``into_torch`` does: the alias would see (or make) the replays' writes.
        """
        self._check("export it through DLPack")
        what = f"export {self._describe()} through DLPack"
        within_storage(self._torch, what)          # the capsule would describe freed bytes
        borrows.check_host_write(self._torch, what)
        replayed.check_not_replayed(self._torch, what)
        return self._torch.__dlpack__(stream=stream, **kwargs)

    def __dlpack_device__(self):
        """The DLPack ``(device_type, device_id)`` pair."""
        self._check("export it through DLPack")
        return self._torch.__dlpack_device__()


from . import shared as _shared  # noqa: E402  (shared imports this module)
