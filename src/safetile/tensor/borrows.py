"""Storage borrows held by in-flight operations, and the storage-overlap test.

"A storage region may be mutably partitioned or shared, never both at once." Handles alone
cannot enforce this: zero-copy views (``t.slice``, ``t.reshape``, two ``st.from_torch`` of
one torch storage) are separate handles over the same bytes. So the launcher, before
anything runs, calls :func:`acquire` with the torch tensors it reads and writes; the hold
lives until the operation is synchronized (``Hold.release()``).

Rules checked by :func:`acquire` (``AliasError``, nothing registered on failure):

* within one call, a write overlaps no other write and no read;
* against holds already registered: a new write overlaps no existing hold, a new read
  overlaps no existing *write* (any number of in-flight reads may share storage).

:func:`check_host_read` / :func:`check_host_write` protect host access (``to_torch``,
``numpy``, DLPack export, ``Shared.try_unwrap``) against in-flight writers (``BorrowError``).

Overlap is decided on byte ranges, device by device (:func:`overlaps`). The common case,
disjoint byte extents, costs a few integer comparisons.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..errors import AliasError, BorrowError
from .ownership import LOCK

__all__ = ["acquire", "Hold", "check_host_read", "check_host_write", "overlaps",
           "active_holds", "EXACT_LIMIT"]

#: Above this many elements (either tensor) the exact element-set check is skipped and
#: overlapping extents are conservatively reported as overlapping.
EXACT_LIMIT = 1 << 22


# ---------------------------------------------------------------------------------------
# the overlap test
# ---------------------------------------------------------------------------------------

class _Extent:
    """Byte extent ``[lo, hi)`` of a torch tensor plus what the exact check needs."""

    __slots__ = ("t", "device", "lo", "hi", "dense", "name", "write", "hold")

    def __init__(self, t: torch.Tensor, name: str = "", write: bool = False, hold=None):
        self.t = t
        self.device = t.device
        self.name = name
        self.write = write
        self.hold = hold
        n = t.numel()
        if n == 0:
            # Empty tensors touch no bytes: lo == hi makes every interval test fail.
            self.lo = self.hi = 0
            self.dense = True
            return
        isz = t.element_size()
        self.lo = lo = t.data_ptr()
        if t.is_contiguous():                  # the common case: one C call decides
            self.hi = lo + n * isz
            self.dense = True
            return
        span = 1
        for size, stride in zip(t.shape, t.stride()):
            span += (size - 1) * stride        # torch strides are never negative
        self.hi = lo + span * isz
        # Dense: the elements cover every byte of [lo, hi). span == numel alone is not
        # enough (stride-0 dims can repeat elements), hence the per-dim check.
        self.dense = span == n and _is_dense(t)


def _is_dense(t: torch.Tensor) -> bool:
    """True if ``t``'s elements are non-overlapping and fill their extent (any dim order)."""
    if t.is_contiguous():
        return True
    dims = sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def _element_offsets(t: torch.Tensor) -> torch.Tensor:
    """Element offsets (relative to ``t.data_ptr()``, in elements) of every element of ``t``,
    as a flat CPU int64 tensor. Built by broadcasting ``arange(size) * stride`` per dim,
    which equals ``as_strided(arange(span), sizes, strides)`` without allocating ``span``."""
    off = torch.zeros((), dtype=torch.int64)
    for size, stride in zip(t.shape, t.stride()):
        off = off.unsqueeze(-1) + torch.arange(size, dtype=torch.int64) * stride
    return off.reshape(-1)


def _exact_overlap(a: _Extent, b: _Extent) -> bool:
    ta, tb = a.t, b.t
    if ta.numel() > EXACT_LIMIT or tb.numel() > EXACT_LIMIT:
        return True                                   # too big to enumerate: conservative
    isa, isb = ta.element_size(), tb.element_size()
    base = min(a.lo, b.lo)
    if isa == isb and (a.lo - b.lo) % isa == 0:
        # Same element grid: compare element indices.
        oa = _element_offsets(ta) + (a.lo - base) // isa
        ob = _element_offsets(tb) + (b.lo - base) // isa
    else:
        # Different element sizes or misaligned: compare the byte sets.
        if ta.numel() * isa > EXACT_LIMIT or tb.numel() * isb > EXACT_LIMIT:
            return True
        oa = ((_element_offsets(ta) * isa + (a.lo - base)).unsqueeze(-1)
              + torch.arange(isa, dtype=torch.int64)).reshape(-1)
        ob = ((_element_offsets(tb) * isb + (b.lo - base)).unsqueeze(-1)
              + torch.arange(isb, dtype=torch.int64)).reshape(-1)
    if oa.numel() > ob.numel():
        oa, ob = ob, oa
    return bool(torch.isin(oa, ob).any())


def _overlap(a: _Extent, b: _Extent) -> bool:
    # Hot path: disjoint extents (or empty tensors) are decided by two comparisons.
    if a.lo >= b.hi or b.lo >= a.hi:
        return False
    if a.device != b.device:
        return False
    if a.dense and b.dense:
        return True
    return _exact_overlap(a, b)


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two torch tensors share at least one byte of memory.

    Different devices never overlap; empty tensors never overlap. Disjoint byte extents do
    not overlap; overlapping extents of two dense tensors do. Otherwise (strided views such
    as even/odd columns) the element sets are enumerated and intersected exactly, unless a
    tensor has more than :data:`EXACT_LIMIT` elements: then the answer is a conservative True.
    """
    return _overlap(_Extent(a), _Extent(b))


def self_overlapping(t: torch.Tensor) -> bool:
    """Whether two different indices of ``t`` may address the same element.

    Exact for every layout whose dims, taken by increasing stride, each step past the span of
    the smaller ones: all views made by slicing, transposing or reshaping a dense tensor.
    Any other layout (stride 0 from ``expand``, interleaved strides) counts as overlapping.
    Unlike ``torch._debug_has_internal_overlap``, a strided slice of a larger buffer does not.
    """
    if t.is_contiguous() or t.numel() == 0:
        return False
    span = 0
    for stride, size in sorted((abs(st), sz) for sz, st in zip(t.shape, t.stride()) if sz != 1):
        if stride <= span:
            return True
        span += stride * (size - 1)
    return False


# ---------------------------------------------------------------------------------------
# the registry
# ---------------------------------------------------------------------------------------

# device -> {id(extent): extent} held by in-flight operations (reads and writes); a dict so
# that release is O(1) per borrow. Guarded by LOCK.
_HOLDS: dict[torch.device, dict[int, _Extent]] = {}
_NONE: dict[int, _Extent] = {}


def _label(name: str, write: bool) -> str:
    """Render an argument name: a bare identifier ``z`` becomes ``Out 'z'`` / ``In 'z'``;
    anything else (``"Ptr 'p'"``) is used verbatim."""
    if name.isidentifier():
        return f"{'Out' if write else 'In'} '{name}'"
    return name


def _where(a: _Extent, b: _Extent) -> str:
    """Describe the overlapping memory of two extents for a message."""
    try:
        sa = a.t.untyped_storage().data_ptr()
        sb = b.t.untyped_storage().data_ptr()
    except Exception:                                   # pragma: no cover - exotic tensors
        sa, sb = None, object()
    if sa == sb:
        return (f"same storage, bytes [{a.lo - sa}, {a.hi - sa}) and "
                f"[{b.lo - sb}, {b.hi - sb})")
    return f"overlapping memory, addresses [{a.lo:#x}, {a.hi:#x}) and [{b.lo:#x}, {b.hi:#x})"


class Hold:
    """The borrows one in-flight operation holds; :meth:`release` ends them (idempotent)."""

    __slots__ = ("holder", "_extents", "_released")

    def __init__(self, holder: str):
        self.holder = holder
        self._extents: list[_Extent] = []
        self._released = False

    @property
    def released(self) -> bool:
        """True once :meth:`release` has run."""
        return self._released

    def release(self) -> None:
        """Remove this hold's borrows from the registry. Calling it again does nothing."""
        with LOCK:
            if self._released:
                return
            self._released = True
            for e in self._extents:
                held = _HOLDS.get(e.device)
                if held is not None:
                    held.pop(id(e), None)
                    if not held:
                        del _HOLDS[e.device]
            self._extents = []

    def __enter__(self) -> "Hold":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self._released else f"{len(self._extents)} borrows"
        return f"Hold({self.holder!r}, {state})"


def acquire(holder: str,
            reads: Sequence[tuple[str, torch.Tensor]] = (),
            writes: Sequence[tuple[str, torch.Tensor]] = ()) -> Hold:
    """Register the storage an operation reads and writes while it is in flight.

    ``holder`` names the operation (``"kernel 'add' (examples/01.py:12)"``); ``reads`` and
    ``writes`` are ``(name, torch_tensor)`` pairs, names as in :func:`_label`. Raises
    :class:`AliasError` (and registers nothing) if a write overlaps another argument of the
    same call, or conflicts with a hold already registered.
    """
    hold = Hold(holder)
    new_w = [_Extent(t, n, True, hold) for n, t in writes]
    new_r = [_Extent(t, n, False, hold) for n, t in reads]

    # 1. Within the call: each write against later writes and all reads.
    for i, w in enumerate(new_w):
        for other in new_w[i + 1:]:
            if _overlap(w, other):
                _raise_internal(holder, w, other)
        for r in new_r:
            if _overlap(w, r):
                _raise_internal(holder, w, r)

    with LOCK:
        # 2. Against in-flight holds: writes vs everything, reads vs writes.
        # The interval test is inlined: this loop runs per launch and per in-flight borrow.
        if _HOLDS:
            for w in new_w:
                lo, hi = w.lo, w.hi
                for e in _HOLDS.get(w.device, _NONE).values():
                    if e.lo < hi and lo < e.hi and _overlap(w, e):
                        _raise_external(holder, w, e)
            for r in new_r:
                lo, hi = r.lo, r.hi
                for e in _HOLDS.get(r.device, _NONE).values():
                    if e.write and e.lo < hi and lo < e.hi and _overlap(r, e):
                        _raise_external(holder, r, e)
        # 3. Register (empty tensors hold nothing).
        for e in new_w + new_r:
            if e.hi > e.lo:
                _HOLDS.setdefault(e.device, {})[id(e)] = e
                hold._extents.append(e)
    return hold


def _raise_internal(holder: str, w: _Extent, other: _Extent):
    raise AliasError(
        f"{holder}: {_label(w.name, True)} overlaps {_label(other.name, other.write)} "
        f"({_where(w, other)}); an output must not share memory with another argument of "
        f"the same launch: pass a copy or non-overlapping slices")


def _raise_external(holder: str, new: _Extent, held: _Extent):
    raise AliasError(
        f"{holder}: {_label(new.name, new.write)} overlaps {_label(held.name, held.write)} "
        f"held by in-flight {held.hold.holder} ({_where(new, held)}); "
        f"synchronize that operation first (op.sync() or await op) or use separate storage")


def _conflicting(t: torch.Tensor, writes_only: bool) -> _Extent | None:
    if not _HOLDS:                                   # fast path: nothing in flight
        return None
    x = _Extent(t)
    with LOCK:
        for e in _HOLDS.get(x.device, _NONE).values():
            if (e.write or not writes_only) and _overlap(x, e):
                return e
    return None


def check_host_read(t: torch.Tensor, what: str) -> None:
    """Raise :class:`BorrowError` if an in-flight operation writes memory ``t`` covers.

    ``what`` completes "cannot ...", e.g. ``"read Tensor(shape=(4,), float32) with
    to_torch()"``.
    """
    e = _conflicting(t, writes_only=True)
    if e is not None:
        raise BorrowError(
            f"cannot {what}: in-flight {e.hold.holder} is writing this memory through "
            f"{_label(e.name, True)}; synchronize that operation first (op.sync() or await op)")


def check_host_write(t: torch.Tensor, what: str) -> None:
    """Raise :class:`BorrowError` if any in-flight operation reads or writes ``t``'s memory
    (used before handing out mutable access: DLPack export, ``into_torch``, unwrap)."""
    e = _conflicting(t, writes_only=False)
    if e is not None:
        verb = "writing" if e.write else "reading"
        raise BorrowError(
            f"cannot {what}: in-flight {e.hold.holder} is {verb} this memory through "
            f"{_label(e.name, e.write)}; synchronize that operation first "
            f"(op.sync() or await op)")


def active_holds() -> list[tuple[str, str, bool, torch.Tensor]]:
    """A snapshot ``(holder, name, is_write, tensor)`` of every registered borrow."""
    with LOCK:
        return [(e.hold.holder, e.name, e.write, e.t)
                for held in _HOLDS.values() for e in held.values()]

