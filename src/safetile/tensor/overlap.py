"""Whether two tensors share memory, decided on byte ranges; and self-overlapping layouts.

The common case, disjoint byte extents, costs two integer comparisons. Overlapping extents of
two dense tensors overlap; otherwise (strided views such as even/odd columns) the element sets
are enumerated and intersected exactly, up to :data:`EXACT_LIMIT` elements.
"""
from __future__ import annotations

import weakref

import torch

__all__ = ["Extent", "overlaps", "self_overlapping", "EXACT_LIMIT", "label", "describe_overlap"]

#: Above this many elements (either tensor) the exact element-set check is skipped and
#: overlapping extents are conservatively reported as overlapping.
EXACT_LIMIT = 1 << 22



class Extent:
    """The bytes ``[lo, hi)`` one argument touches, and what the exact check needs.

    Immutable, and holding only a weak reference to its tensor (``tref``), so that a launch
    plan may keep extents across launches without keeping memory alive. While an operation
    holds an extent, the operation keeps the tensor alive. ``level``: the smallest ``c`` with
    ``hi - lo <= 2**c``, the level of the address index that files it (``registry.Index``).
    """

    __slots__ = ("tref", "device", "lo", "hi", "dense", "name", "write", "numel", "itemsize",
                 "shape", "strides", "level")

    def __init__(self, t: torch.Tensor, name: str = "", write: bool = False):
        self.tref = weakref.ref(t)
        self.device = t.device
        self.name = name
        self.write = write
        # The layout, kept for the exact check: it must not need the tensor, whose weak
        # reference the collector may clear while a queued finalizer still holds the bytes.
        self.numel = n = t.numel()
        self.itemsize = t.element_size()
        self.shape, self.strides = tuple(t.shape), t.stride()
        if n == 0:
            # Empty tensors touch no bytes: lo == hi makes every interval test fail.
            self.lo = self.hi = 0
            self.dense = True
            self.level = 0
            return
        isz = self.itemsize
        self.lo = lo = t.data_ptr()
        if t.is_contiguous():                  # the common case: one C call decides
            self.hi = lo + n * isz
            self.dense = True
            self.level = (n * isz - 1).bit_length()
            return
        span = 1
        for size, stride in zip(self.shape, self.strides):
            span += (size - 1) * stride        # torch strides are never negative
        self.hi = lo + span * isz
        self.level = (span * isz - 1).bit_length()
        # Dense: the elements cover every byte of [lo, hi). span == numel alone is not
        # enough (stride-0 dims can repeat elements), hence the per-dim check.
        self.dense = span == n and _is_dense(t)

    @property
    def t(self) -> torch.Tensor:
        """The tensor (alive while an operation holds this extent, or its handle lives)."""
        return self.tref()


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


def _element_offsets(shape: tuple, strides: tuple) -> torch.Tensor:
    """Element offsets (relative to the first element, in elements) of every element of a
    tensor of ``shape`` and ``strides``, as a flat CPU int64 tensor. Built by broadcasting ``arange(size) * stride`` per dim,
    which equals ``as_strided(arange(span), sizes, strides)`` without allocating ``span``."""
    off = torch.zeros((), dtype=torch.int64)
    for size, stride in zip(shape, strides):
        off = off.unsqueeze(-1) + torch.arange(size, dtype=torch.int64) * stride
    return off.reshape(-1)


def _exact_overlap(a: Extent, b: Extent) -> bool:
    if a.numel > EXACT_LIMIT or b.numel > EXACT_LIMIT:
        return True                                   # too big to enumerate: conservative
    isa, isb = a.itemsize, b.itemsize
    base = min(a.lo, b.lo)
    if isa == isb and (a.lo - b.lo) % isa == 0:
        # Same element grid: compare element indices.
        oa = _element_offsets(a.shape, a.strides) + (a.lo - base) // isa
        ob = _element_offsets(b.shape, b.strides) + (b.lo - base) // isa
    else:
        # Different element sizes or misaligned: compare the byte sets.
        if a.numel * isa > EXACT_LIMIT or b.numel * isb > EXACT_LIMIT:
            return True
        oa = ((_element_offsets(a.shape, a.strides) * isa + (a.lo - base)).unsqueeze(-1)
              + torch.arange(isa, dtype=torch.int64)).reshape(-1)
        ob = ((_element_offsets(b.shape, b.strides) * isb + (b.lo - base)).unsqueeze(-1)
              + torch.arange(isb, dtype=torch.int64)).reshape(-1)
    if oa.numel() > ob.numel():
        oa, ob = ob, oa
    return bool(torch.isin(oa, ob).any())


def _overlap(a: Extent, b: Extent) -> bool:
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
    return _overlap(Extent(a), Extent(b))


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


def past_storage(t: torch.Tensor) -> bool:
    """Whether ``t`` reaches past the end of its storage (shrunk through a torch alias since
    the view was made): reading or writing it would touch freed memory."""
    s = t.untyped_storage()
    return bool(t.numel()) and Extent(t).hi > s.data_ptr() + s.nbytes()


def label(name: str, write: bool) -> str:
    """Render an argument name: a bare identifier ``z`` becomes ``Out 'z'`` / ``In 'z'``;
    anything else (``"Ptr 'p'"``) is used verbatim."""
    if name.isidentifier():
        return f"{'Out' if write else 'In'} '{name}'"
    return name


def describe_overlap(a: Extent, b: Extent) -> str:
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
